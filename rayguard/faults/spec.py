"""The fault-injection spec: a pure parser of ``GuardConfig(faults=...)`` /
``RAYGUARD_FAULTS`` into :class:`Fault` records (no Ray, no process control: the config
validates against it; :mod:`rayguard.faults.injector` fires the faults).

Spec format: faults separated by ``;``, fields by ``,``::

    kill:rank=1,step=5          # SIGKILL the worker process when rank 1 reports step 5
    hang:rank=0,step=9          # block rank 0 forever (or seconds=S) at step 9
    raise:rank=*,step=3         # raise InjectedFault on every rank at step 3
    nan:rank=0,step=4,metric=loss   # report loss=NaN at step 4
    kill:rank=0,at=load         # SIGKILL rank 0 inside rayguard.train.load_state()
    kill:rank=1,at=setup,attempt=1  # SIGKILL rank 1 in rayguard's worker set-up, attempt 1

Fields: ``rank`` (an int or ``*``, default ``*``), ``step`` (int; required unless
``at=load`` or ``at=setup``), ``at`` (``report``, the default; ``load``; or ``setup``: in
rayguard's worker set-up, before the rank has told the others it is there), ``attempt`` (only on that
attempt; default: the first attempt that reaches the fault), ``seconds`` (hang only; default
forever), ``metric`` (nan only; default ``loss``).

A fault knows where it was given (:attr:`Fault.source`: :data:`CONFIG_SOURCE` or
:data:`ENV_SOURCE`), and the mark it leaves for the controller says so
(:func:`injected_mark`, read back by :func:`read_injected_mark`): a failure reads
``injected kill (GuardConfig(faults=...))``, not a guess between the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayguard.constants import FAULTS_ENV_VAR
from rayguard.exceptions import FaultSpecError

KINDS = ("kill", "hang", "raise", "nan")
POINTS = ("report", "load", "setup")
_FIELDS = {"rank", "step", "at", "attempt", "seconds", "metric"}

CONFIG_SOURCE = "GuardConfig(faults=...)"
"""A fault given in the trainer's ``GuardConfig``."""
ENV_SOURCE = FAULTS_ENV_VAR
"""A fault given in the ``RAYGUARD_FAULTS`` environment variable."""
SOURCES = (CONFIG_SOURCE, ENV_SOURCE)
EITHER_SOURCE = f"{CONFIG_SOURCE} or {ENV_SOURCE}"
"""What a mark with no source (left by an older worker) says of where its fault came from."""


@dataclass(frozen=True)
class Fault:
    """One fault to inject."""

    kind: str
    rank: int | None = None
    """None: every rank."""
    step: int | None = None
    at: str = "report"
    attempt: int | None = None
    seconds: float | None = None
    metric: str = "loss"
    source: str = CONFIG_SOURCE
    """Where the fault was given: :data:`CONFIG_SOURCE` or :data:`ENV_SOURCE` (not part of
    :attr:`key`: the same fault given in both fires once)."""

    @property
    def key(self) -> str:
        """Stable identity used to fire the fault once per run."""
        return (f"{self.kind}:rank={'*' if self.rank is None else self.rank},step={self.step},"
                f"at={self.at},attempt={self.attempt}")

    def matches(self, *, rank: int, step: int | None, at: str, attempt: int) -> bool:
        if self.at != at:
            return False
        if self.rank is not None and self.rank != rank:
            return False
        if self.attempt is not None and self.attempt != attempt:
            return False
        return at in ("load", "setup") or self.step == step


def _bad(part: str, why: str) -> FaultSpecError:
    return FaultSpecError(
        f"fault spec {part!r}: {why}. Fix: write faults as 'kind:rank=R,step=S' joined by ';', "
        f"kind one of {', '.join(KINDS)} (e.g. 'kill:rank=1,step=5;nan:rank=0,step=9')"
    )


def _int_field(part: str, name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise _bad(part, f"{name}={value!r} is not an integer") from None
    if number < 0:
        raise _bad(part, f"{name}={number} must be >= 0")
    return number


def _parse_one(part: str, source: str) -> Fault:
    kind, _, rest = part.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise _bad(part, f"unknown kind {kind!r}")
    fields: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not value:
            raise _bad(part, f"field {item!r} is not name=value")
        if name not in _FIELDS:
            raise _bad(part, f"unknown field {name!r} (known: {', '.join(sorted(_FIELDS))})")
        if name in fields:
            raise _bad(part, f"field {name!r} given twice")
        fields[name] = value
    at = fields.get("at", "report")
    if at not in POINTS:
        raise _bad(part, f"at={at!r} must be one of {', '.join(POINTS)}")
    rank = fields.get("rank", "*")
    step = _int_field(part, "step", fields["step"]) if "step" in fields else None
    if at == "report" and step is None:
        raise _bad(part, "step is required (or at=load, at=setup)")
    if "seconds" in fields and kind != "hang":
        raise _bad(part, "seconds applies to hang only")
    if "metric" in fields and kind != "nan":
        raise _bad(part, "metric applies to nan only")
    if kind == "nan" and at != "report":
        raise _bad(part, f"nan faults poison a reported metric, so at={at} is meaningless")
    seconds = None
    if "seconds" in fields:
        try:
            seconds = float(fields["seconds"])
        except ValueError:
            raise _bad(part, f"seconds={fields['seconds']!r} is not a number") from None
        if not seconds > 0:
            raise _bad(part, "seconds must be > 0")
    return Fault(
        kind=kind,
        rank=None if rank == "*" else _int_field(part, "rank", rank),
        step=step,
        at=at,
        attempt=_int_field(part, "attempt", fields["attempt"]) if "attempt" in fields else None,
        seconds=seconds,
        metric=fields.get("metric", "loss"),
        source=source,
    )


def parse_faults(spec: str | None, *, source: str = CONFIG_SOURCE) -> tuple[Fault, ...]:
    """Parse a fault spec given in ``source``; raises :class:`FaultSpecError` naming the bad
    part and the fix."""
    if not spec or not spec.strip():
        return ()
    return tuple(_parse_one(part.strip(), source) for part in spec.split(";") if part.strip())


def faults_from(config: str | None, env: str | None) -> tuple[Fault, ...]:
    """Every fault of a worker: ``GuardConfig(faults=config)``'s, then the ``RAYGUARD_FAULTS``
    environment variable's (``env``), each with its source."""
    return parse_faults(config) + parse_faults(env, source=ENV_SOURCE)


def injected_mark(kind: str, source: str) -> str:
    """The mark a worker leaves before an injected fault fires (the controller classifies
    its failure by it): ``injected kill (RAYGUARD_FAULTS)``."""
    return f"injected {kind} ({source})"


def read_injected_mark(mark: object) -> tuple[str, str] | None:
    """``(label, source)`` of an injected fault's mark: ``("injected kill",
    "GuardConfig(faults=...)")``; a mark with no known source (``injected kill``, from a
    worker before sources were marked): :data:`EITHER_SOURCE`. ``None``: not such a mark."""
    if not isinstance(mark, str) or not mark.startswith("injected "):
        return None
    label, _, rest = mark.partition(" (")
    source = rest[:-1] if rest.endswith(")") else ""
    return label, source if source in SOURCES else EITHER_SOURCE
