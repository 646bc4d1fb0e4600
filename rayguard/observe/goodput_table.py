"""The goodput of a run as text: ``rayguard events RUN --goodput`` and the driver's last line."""

from __future__ import annotations

from rayguard.observe.goodput import CAUSES, RESTART_PHASES, Goodput

CAUSE_WORDS = {"startup": "start-up (Ray, the workers, set-up, before the first step)",
               "restart": "restarts", "resize": "resizes in place", "replay": "replayed steps", "checkpoint": "checkpoints",
               "stall": "stalls", "preemption": "preemption", "other": "unaccounted time"}
"""How the headline names a cause of badput."""


UNIT_NOUNS = {"step": "step", "global_step": "step", "training_iteration": "iteration",
              "iteration": "iteration", "epoch": "epoch", "report": "report",
              "optimizer_step": "optimizer step"}
"""The noun of each step unit (a ``ray.train.report`` loop's step key, or ``"report"``; the
replay of a loop that reports rarer than it steps its optimizers: ``"optimizer_step"``)."""


def noun(unit: str) -> str:
    """The noun of a step unit: ``"epoch"`` for ``epoch``, ``"step"`` for ``global_step``;
    an unknown unit reads as a step."""
    return UNIT_NOUNS.get(unit, "step")


def counted(n: int, unit: str = "step") -> str:
    """``n`` of ``unit`` in words: ``"3 epochs"``, ``"1 step"``, ``"2 reports"``."""
    return f"{n} {noun(unit)}{'s' if n != 1 else ''}"


def headline(g: Goodput) -> str:
    """``goodput 0.68 (61.0 s productive of 90.0 s, 1 restart, 26 steps replayed; most of
    the rest: restarts 20.1 s)``: the largest cause of badput named, so that a short healthy
    run's low figure reads as its start-up, not as a failure. The replay is counted in the
    run's step unit (``3 epochs replayed``), in optimizer steps for a loop that reports
    rarer than it steps its optimizers (``10 optimizer steps replayed``)."""
    if g.ratio is None:
        return "goodput not measured (no events)"
    text = (f"goodput {g.ratio:.2f} ({g.productive_s:.1f} s productive of {g.wall_s:.1f} s, "
            f"{g.restarts} restart{'s' if g.restarts != 1 else ''}, "
            + (f"{g.resizes} resize{'s' if g.resizes != 1 else ''} in place, " if g.resizes
               else "")
            + f"{counted(g.replayed_steps, g.replay_unit)} replayed")
    cause = largest_cause(g)
    if cause is not None:
        words = f"replayed {noun(g.replay_unit)}s" if cause == "replay" else CAUSE_WORDS.get(
            cause, cause)
        text += f"; most of the rest: {words} {g.badput_s[cause]:.1f} s"
    return text + ")"


def largest_cause(g: Goodput) -> str | None:
    """The cause of badput that cost the most (``None``: no badput of note, under 5% of the
    wall time)."""
    if not g.badput_s or g.wall_s <= 0:
        return None
    cause = max(CAUSES, key=lambda c: g.badput_s.get(c, 0.0))
    return cause if g.badput_s.get(cause, 0.0) >= 0.05 * g.wall_s else None


def _share(seconds: float, wall: float) -> str:
    return f"{100.0 * seconds / wall:6.1f}%" if wall > 0 else "      -"


def format_goodput(g: Goodput) -> str:
    """The run's figures: productive time and each cause (restart phases indented), then
    one row per attempt, then what could not be measured."""
    lines = [headline(g), "", f"{'':<16}{'seconds':>10} {'share':>7}",
             f"{'productive':<16}{g.productive_s:>10.2f} {_share(g.productive_s, g.wall_s)}"]
    for cause in CAUSES:
        lines.append(f"{cause:<16}{g.badput_s[cause]:>10.2f} {_share(g.badput_s[cause], g.wall_s)}")
        if cause == "restart":
            lines += [f"  {phase:<14}{g.restart_s[phase]:>10.2f}" for phase in RESTART_PHASES]
    lines.append(f"{'wall':<16}{g.wall_s:>10.2f}")
    if g.attempts:
        cols = ("productive",) + CAUSES
        lines += ["", "attempt  start_s    end_s " + " ".join(f"{c:>10}" for c in cols)
                  + "  outcome   restored replayed"]
        for a in g.attempts:
            values = (a.productive_s,) + tuple(a.badput_s[c] for c in CAUSES)
            lines.append(f"{a.attempt:>7} {a.start_s:>8.1f} {a.end_s:>8.1f} "
                         + " ".join(f"{v:>10.2f}" for v in values)
                         + f"  {a.outcome:<9} {_opt(a.restored_step):>8} {a.replayed_steps:>8}")
    if g.not_measured:
        lines += ["", "not measured:"] + [f"  - {n}" for n in g.not_measured]
    return "\n".join(lines)


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)
