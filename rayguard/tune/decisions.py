"""What to do about an unhealthy trial: a pure planner, decisions as data.

:func:`decide` turns a :class:`~rayguard.health.checks.Verdict` into a
:class:`~rayguard.health.decisions.Decision`
(``RESTART`` from the newest good checkpoint taken before the anomaly began, or ``FAIL``
once the restart budget is spent); :mod:`rayguard._ray.tune` applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rayguard.health.checks import NONFINITE, Point, Verdict
from rayguard.health.config import HealthConfig
from rayguard.health.decisions import FAIL, RESTART, CheckpointRecord, Decision


def choose_checkpoint(records: Sequence[CheckpointRecord], before_iteration: int,
                      is_good: Callable[[str], bool]) -> CheckpointRecord | None:
    """The newest checkpoint reported before ``before_iteration`` that ``is_good``."""
    for record in reversed(records):
        if record.iteration < before_iteration and is_good(record.path):
            return record
    return None


def decide(verdict: Verdict, restarts_done: int, health: HealthConfig,
           records: Sequence[CheckpointRecord], is_good: Callable[[str], bool]) -> Decision:
    """Restart from the last good checkpoint, or fail when policy or budget says so."""
    what = f"{verdict.check}: {verdict.detail}"
    if verdict.check == NONFINITE and health.nan_policy == "fail":
        return Decision(FAIL, verdict,
                        f"trial {verdict.trial_id} failed on {what} (nan_policy='fail'). "
                        "Fix the source of the non-finite value, or pass "
                        "nan_policy='restart' to restart from the last good checkpoint",
                        restarts=restarts_done)
    if restarts_done >= health.max_restarts:
        return Decision(FAIL, verdict,
                        f"trial {verdict.trial_id} failed on {what} after "
                        f"{restarts_done} health restart(s) (max_restarts="
                        f"{health.max_restarts}). Raise HealthConfig.max_restarts, or fix "
                        "the cause", restarts=restarts_done)
    record = choose_checkpoint(records, verdict.since_iteration, is_good)
    origin = (f"checkpoint of iteration {record.iteration}" if record
              else "scratch (no good checkpoint before the anomaly)")
    return Decision(RESTART, verdict,
                    f"restarting trial {verdict.trial_id} from {origin} "
                    f"({restarts_done + 1}/{health.max_restarts}) after {what}",
                    checkpoint=record, restarts=restarts_done + 1)


def rewind(points: Sequence[Point], records: Sequence[CheckpointRecord],
           checkpoint: CheckpointRecord | None) -> tuple[list[Point], list[CheckpointRecord]]:
    """A trial's series and checkpoints as they stand after restoring ``checkpoint``: what
    came after it is dropped (``None``: everything is)."""
    upto = checkpoint.iteration if checkpoint else 0
    return ([p for p in points if p.iteration <= upto],
            [r for r in records if r.iteration <= upto])
