"""Preemption: a checkpoint just in time.

A spot or preemptible machine gives notice: SIGTERM and a grace period (or, on Ray, a node
drain with a deadline, which Ray Train passes to every worker). On notice:

1. the worker's SIGTERM handler (installed on the actor's main thread at set-up, chaining
   to the handler that was there) only notes the time; the worker keeps running;
2. at the next ``report`` the notice rides on the per-report flag all-reduce
   (:mod:`rayguard.train.agreement`), so every rank learns it at the same step, and the
   rank(s) that received it record ``preemption_notice``;
3. from the next step on ``rayguard.train.should_checkpoint()`` is True on every rank
   (the same value at the same step) until a checkpoint is saved; a loop that passes
   ``state=`` when it is True checkpoints just in time;
4. once that checkpoint is committed (a barrier after rank 0's commit), rank 0 records
   ``preemption_checkpoint`` and a rank that received SIGTERM hands the signal on to the
   previous handler (Ray's: the worker exits, and Ray Train restarts the group from that
   checkpoint). If no checkpoint comes within the grace period, the signal is handed on
   then. A second SIGTERM is handed on at once.

A SIGTERM that arrives when no training function runs in this worker is handed on at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayguard.constants import DEFAULT_PREEMPTION_GRACE_S, PREEMPTION_GRACE_ENV_VAR
from rayguard.run.link import RunLink
from rayguard.train.agreement import Agreement, Flags

logger = logging.getLogger("rayguard")


def grace_period_s(env: dict[str, str]) -> float:
    """``RAYGUARD_PREEMPTION_GRACE_S``: how long a SIGTERM'd worker may run before the signal
    is handed on (default 25 s: inside the usual 30 s of Kubernetes and cloud spot notices)."""
    raw = env.get(PREEMPTION_GRACE_ENV_VAR, str(DEFAULT_PREEMPTION_GRACE_S))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        logger.warning("rayguard: %s=%r is not a number of seconds in [0, 3600]; using %s. Fix: "
                       "set e.g. %s=25", PREEMPTION_GRACE_ENV_VAR, raw, DEFAULT_PREEMPTION_GRACE_S,
                       PREEMPTION_GRACE_ENV_VAR)
        return DEFAULT_PREEMPTION_GRACE_S
    return value


@dataclass(frozen=True)
class Notice:
    source: str
    """``"SIGTERM"`` or ``"ray drain"``."""
    grace_s: float | None
    received_at: float
    """``time.monotonic()`` when it arrived."""


# -- the SIGTERM handler (one per process, as signals are: not in rayguard.runtime) ----------
class _Sigterm:
    def __init__(self) -> None:
        self.previous: Any = None
        self.installed = False
        self.active = False
        self.grace_s = DEFAULT_PREEMPTION_GRACE_S
        self.notice: Notice | None = None
        self.released = False
        self.timer: threading.Timer | None = None


_SIGTERM = _Sigterm()


def _handler(signum: int, frame: Any) -> None:
    s = _SIGTERM
    if not s.active or s.released or s.notice is not None:
        _hand_on(signum, frame)
        return
    s.notice = Notice("SIGTERM", s.grace_s, time.monotonic())
    s.timer = threading.Timer(s.grace_s, release)
    s.timer.daemon = True
    s.timer.start()


def _hand_on(signum: int, frame: Any) -> None:
    previous = _SIGTERM.previous
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:  # SIG_DFL (or unknown): end the process as SIGTERM would
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_handler(grace_s: float) -> bool:
    """On the main thread: install the notice handler in front of the current one."""
    if threading.current_thread() is not threading.main_thread():
        return False
    _SIGTERM.grace_s = grace_s
    current = signal.getsignal(signal.SIGTERM)
    if current is not _handler:
        _SIGTERM.previous = current
        signal.signal(signal.SIGTERM, _handler)
    _SIGTERM.installed = True
    return True


def release() -> bool:
    """Hand the received SIGTERM on to the previous handler (from any thread: it is re-sent
    and the handler, seeing ``released``, passes it on). False when it was ignored."""
    if _SIGTERM.released:
        return _SIGTERM.previous != signal.SIG_IGN
    _SIGTERM.released = True
    if _SIGTERM.timer is not None:
        _SIGTERM.timer.cancel()
    os.kill(os.getpid(), signal.SIGTERM)
    return _SIGTERM.previous != signal.SIG_IGN


def set_active(active: bool) -> None:
    """A training function runs in this worker (notices are held) or not (handed on)."""
    _SIGTERM.active = active
    if active:
        _SIGTERM.notice, _SIGTERM.released = None, False


def sigterm_notice() -> Notice | None:
    return _SIGTERM.notice


def install_in_worker(grace_s: float) -> bool:
    """From the training thread: install the handler on the worker actor's main thread."""
    if _SIGTERM.installed:
        _SIGTERM.grace_s = grace_s
        return True
    from rayguard._ray.preemption import run_on_actor_main_thread

    try:
        return bool(run_on_actor_main_thread(install_handler, grace_s))
    except Exception as exc:  # never stop training for this
        logger.warning("rayguard: no SIGTERM preemption notice in this worker (%s); Ray's drain "
                       "information is still used", exc)
        return False


# -- the per-session state --------------------------------------------------------------------
class Preemption:
    """One worker's view: notices seen here, and the agreed ``should_checkpoint``.

    ``sources`` are polled at every report (cheap, local): each returns a :class:`Notice`
    or ``None``."""

    def __init__(self, sources: tuple[Callable[[], Notice | None], ...],
                 on_notice: Callable[[Notice], None] | None = None) -> None:
        self.sources = sources
        self.on_notice = on_notice
        """Told the first time this rank sees a notice."""
        self.local: Notice | None = None
        self.answered = False
        """This rank's notice was answered with a checkpoint."""
        self.pending = False
        """Agreed by every rank: ``should_checkpoint()``."""
        self.released = False

    def local_flag(self) -> bool:
        """Poll the sources; True while this rank holds a notice not yet answered. The first
        time a notice is seen, ``on_notice`` is told."""
        if self.local is None:
            for source in self.sources:
                notice = source()
                if notice is not None:
                    self.local = notice
                    if self.on_notice is not None:
                        self.on_notice(notice)
                    break
        return self.local is not None and not self.answered

    def should_checkpoint(self) -> bool:
        return self.pending

    def after_report(self, agreed: Flags, saved: bool) -> bool:
        """Update after a report's agreement (``saved``: that report saved a checkpoint on
        every rank). True when this report answered a notice just in time."""
        if (self.pending or agreed.notice) and saved:
            self.pending = False
            if self.local is not None:
                self.answered = True
            return True
        if agreed.notice:
            self.pending = True
        return False


def drain_source(rank: int) -> Callable[[], Notice | None]:
    """A source reading Ray Train's drain information (only ranks on a drained node hold a
    notice: the others learn it through the agreement)."""
    from rayguard._ray.preemption import drain_notice

    def poll() -> Notice | None:
        found = drain_notice()
        if found is None or rank not in found[1]:
            return None
        return Notice("ray drain", found[0], time.monotonic())

    return poll


class PreemptionWatch:
    """One worker's preemption notices, answered just in time, over its ``link``.

    ``agreement``: the ranks' per-report agreement (its barrier waits for rank 0's commit);
    ``flush``: hands the reports made so far to Ray Train; ``stop``: stops the watchdog
    before a SIGTERM'd rank goes. ``sources``: the notices polled at every report (none:
    a worker that does not watch, a session in a unit test)."""

    def __init__(self, link: RunLink, agreement: Agreement, *,
                 sources: tuple[Callable[[], Notice | None], ...] = (),
                 flush: Callable[[float], None] = lambda timeout_s: None,
                 stop: Callable[[], None] = lambda: None) -> None:
        self.link = link
        self.agreement = agreement
        self.state = Preemption(sources, on_notice=self._noticed)
        self._flush = flush
        self._stop = stop
        self._step = -1

    def local_flag(self, step: int) -> bool:
        """This rank's flag for the report of ``step`` (``preemption_notice`` is recorded
        the first time a notice is seen)."""
        self._step = step
        return self.state.local_flag()

    def should_checkpoint(self) -> bool:
        return self.state.should_checkpoint()

    def after_report(self, agreed: Flags, *, saved: bool, step: int, checkpoint: Any) -> None:
        """After a report's agreement: a notice answered by this report's checkpoint lets
        a SIGTERM'd rank go."""
        if self.state.after_report(agreed, saved=saved):
            self._answered(step, checkpoint)

    def _noticed(self, notice: Notice) -> None:
        grace = "unknown" if notice.grace_s is None else f"{notice.grace_s:.0f} s"
        self.link.record("preemption_notice", f"{notice.source} on rank {self.link.ctx.rank} "
                         f"(grace period {grace}): every rank checkpoints at the next step that "
                         "passes state= (rayguard.train.should_checkpoint() is True)",
                         step=self._step, wait=True, source=notice.source,
                         grace_s=notice.grace_s)

    def _answered(self, step: int, checkpoint: Any) -> None:
        """Every rank, after the just-in-time checkpoint was saved: wait until rank 0
        committed it (a barrier), record it, and let a SIGTERM'd rank go."""
        self.agreement.barrier()
        if self.link.ctx.rank == 0:
            path = checkpoint if isinstance(checkpoint, str) else getattr(checkpoint, "path", None)
            self.link.record("preemption_checkpoint", f"checkpoint of step {step} committed "
                             "after a preemption notice", step=step, wait=True, path=path)
        notice = self.state.local
        if notice is None or notice.source != "SIGTERM":
            return
        left = (notice.grace_s or 0) - (time.monotonic() - notice.received_at)
        self._flush(max(1.0, left))
        self._stop()
        if release():
            time.sleep(max(1.0, left))  # the previous handler ends the process meanwhile


def watch_preemption(link: RunLink, agreement: Agreement, *, flush: Callable[[float], None],
                     stop: Callable[[], None]) -> PreemptionWatch:
    """Set-up: hold SIGTERM in this worker (on its main thread) and read Ray's drain
    information at every report."""
    install_in_worker(grace_period_s(dict(os.environ)))
    set_active(True)
    return PreemptionWatch(link, agreement, sources=(sigterm_notice, drain_source(link.ctx.rank)),
                           flush=flush, stop=stop)
