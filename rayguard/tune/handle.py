"""TuneRun: the handle ``rayguard.tune.run`` returns while the sweep runs.

``Tuner.fit()`` runs in a daemon thread of the driver (Tune installs no signal handlers
outside the main thread, so Ctrl+C stays with the caller); the handle reads the health
callback's state and event log, which are thread-safe.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from rayguard.exceptions import RayGuardError

if TYPE_CHECKING:
    from ray.tune import ResultGrid, Tuner

    from rayguard.tune.callback import HealthCallback, TrialStatus
    from rayguard.tune.events import SweepEvent


class SweepNotDoneError(RayGuardError):
    """``TuneRun.result()`` was called while the sweep is still running."""


class TuneRun:
    """A running sweep. Created by :func:`rayguard.tune.run`; do not build it yourself."""

    def __init__(self, tuner: Tuner, callback: HealthCallback, experiment_path: str) -> None:
        self._tuner = tuner
        self._callback = callback
        self.experiment_path = experiment_path
        """The experiment directory (pass it as ``restore=`` to resume the sweep)."""
        self._done = threading.Event()
        self._result: ResultGrid | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._fit, name="rayguard-tune-fit",
                                        daemon=True)
        self._thread.start()

    def _fit(self) -> None:
        try:
            self._result = self._tuner.fit()
        except BaseException as e:  # handed to the caller of wait()/result()
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        """True once the sweep has ended (finished, stopped or failed)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> ResultGrid:
        """Block until the sweep ends and return Tune's ``ResultGrid``.

        Raises ``TimeoutError`` if it is still running after ``timeout`` seconds, and
        re-raises what ``Tuner.fit()`` raised, if anything.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"the sweep in {self.experiment_path} is still running after "
                               f"{timeout} s; call wait() again or stop() it")
        return self.result()

    def result(self) -> ResultGrid:
        """The ``ResultGrid`` of an ended sweep, without waiting."""
        if not self._done.is_set():
            raise SweepNotDoneError(f"the sweep in {self.experiment_path} is still running; "
                                    "use wait(timeout) to block until it ends")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def status(self) -> dict[str, TrialStatus]:
        """Per trial: Tune state, last metrics, health restarts and the last verdict."""
        return self._callback.status()

    def events(self, kind: str | None = None, trial_id: str | None = None
               ) -> list[SweepEvent]:
        """The sweep's events so far (optionally one kind or one trial)."""
        return self._callback.event_log.events(kind, trial_id)

    def stop(self, timeout: float | None = 120.0) -> ResultGrid:
        """Stop every trial gracefully (their checkpoints are kept), wait for the sweep to
        end and return its ``ResultGrid``. Resume later with ``run(..., restore=path)``."""
        if not self._done.is_set():
            self._callback.request_stop()
        return self.wait(timeout)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"TuneRun({self.experiment_path!r}, {state})"
