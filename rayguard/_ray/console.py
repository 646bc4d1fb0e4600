"""Ray's console lines about a failure rayguard handles, kept off the console.

A worker killed in a run rayguard recovers made Ray print about 60 lines before rayguard's
one line (``worker_died``, then ``restart``): the controller's failure-policy dump of the
worker error (handled in :class:`rayguard.controller.failure_policy.GuardFailurePolicy`),
the backend's "Graceful shutdown of backend failed" with a traceback, and each survivor's
"Error in training function" with the traceback of the collective its dead peer broke.
These filters drop the last two, each only where it says nothing rayguard does not:

* in the controller, the backend's shutdown warning (a worker crashed: rayguard's
  ``worker_died`` line names it);
* in a worker, the training function's error when it reads as a peer's loss (gloo/NCCL
  connection errors, :func:`rayguard.failures.patterns.reads_as_collateral`); a user's own
  exception keeps Ray's traceback.

And in a worker, one more: Ray stops a worker with SIGTERM, and its handler raises
``SystemExit``; when the signal lands while the process is already exiting, the exception is
raised inside whichever exit callback runs (torch's library finalizers) and Python prints
"Exception ignored in atexit callback" with a traceback. From the start of the worker's exit,
a SIGTERM ends the process at once (:func:`quiet_worker` registers it).

At ``RAYGUARD_LOG_LEVEL=DEBUG`` nothing is dropped. Relies on the loggers of
``ray.train.v2._internal.callbacks.backend_setup`` and ``ray.train.v2._internal.util``
(their messages as in Ray 2.59 and 2.60); a Ray that logs otherwise is left alone.
"""

from __future__ import annotations

import logging

BACKEND_LOGGER = "ray.train.v2._internal.callbacks.backend_setup"
TRAIN_FN_LOGGER = "ray.train.v2._internal.util"


class _DropShutdownNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Graceful shutdown of backend failed")


class _DropPeerLossTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if not text.startswith("Error in training function"):
            return True
        return not peer_loss(text)


def peer_loss(traceback_text: str) -> bool:
    """Whether a training function's traceback ends in an error that follows a peer's loss
    (its last line: ``RuntimeError: [...gloo...] Connection closed by peer``)."""
    from rayguard.failures.patterns import reads_as_collateral

    lines = [line.strip() for line in traceback_text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    error_type, _, summary = last.partition(":")
    return reads_as_collateral(error_type.strip(), summary or last)


def _install(name: str, flt: type[logging.Filter]) -> None:
    from rayguard.logs import log_level

    if log_level() <= logging.DEBUG:
        return
    target = logging.getLogger(name)
    if not any(isinstance(f, flt) for f in target.filters):
        target.addFilter(flt())


def quiet_controller() -> None:
    """In Ray Train's controller: drop the backend's shutdown warning after a crash."""
    _install(BACKEND_LOGGER, _DropShutdownNoise)


_EXIT_QUIETED: list[bool] = []  # per process: the exit hook is registered once per process


def _exit_on_sigterm() -> None:
    """Registered with ``atexit`` after torch's finalizers, so it runs before them."""
    import signal

    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread: Ray's handler stays
        pass


def quiet_worker() -> None:
    """In a worker: drop Ray's traceback of an error that follows a peer's loss, and the
    traceback of a stop signal that lands while the process exits."""
    from rayguard.logs import log_level

    _install(TRAIN_FN_LOGGER, _DropPeerLossTraceback)
    if not _EXIT_QUIETED and log_level() > logging.DEBUG:
        import atexit

        atexit.register(_exit_on_sigterm)
        _EXIT_QUIETED.append(True)


__all__ = ["quiet_controller", "quiet_worker", "peer_loss"]
