import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from rayguard import GuardConfig
from rayguard.exceptions import FaultSpecError, InjectedFault
from rayguard.testing import FaultInjector, parse_faults


def test_parse_documented_example():
    faults = parse_faults("kill:rank=1,step=5;hang:rank=0,step=9")
    assert [(f.kind, f.rank, f.step) for f in faults] == [("kill", 1, 5), ("hang", 0, 9)]


def test_parse_all_fields():
    (f,) = parse_faults("hang:rank=*,step=2,attempt=1,seconds=0.5")
    assert f.rank is None and f.attempt == 1 and f.seconds == 0.5
    (g,) = parse_faults(" nan : rank=0 , step=4 , metric=val_loss ;")
    assert g.metric == "val_loss"
    (h,) = parse_faults("kill:rank=0,at=load")
    assert h.at == "load" and h.step is None
    (s,) = parse_faults("kill:rank=1,at=setup,attempt=1")
    assert s.at == "setup" and s.matches(rank=1, step=None, at="setup", attempt=1)
    assert not s.matches(rank=1, step=None, at="setup", attempt=0)
    assert parse_faults("") == () and parse_faults(None) == ()


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("explode:rank=1,step=2", "unknown kind 'explode'"),
        ("kill:rank=1", "step is required"),
        ("kill:rank=one,step=2", "rank='one' is not an integer"),
        ("kill:rank=1,step=-2", "step=-2 must be >= 0"),
        ("kill:rank=1,step=2,colour=red", "unknown field 'colour'"),
        ("kill:rank=1,step", "field 'step' is not name=value"),
        ("kill:rank=1,step=2,step=3", "given twice"),
        ("kill:step=2,seconds=3", "seconds applies to hang only"),
        ("hang:step=2,seconds=0", "seconds must be > 0"),
        ("kill:step=2,at=later", "at='later'"),
        ("nan:at=load", "meaningless"),
        ("nan:at=setup", "at=setup is meaningless"),
    ],
)
def test_bad_specs_name_the_part_and_the_fix(spec, needle):
    with pytest.raises(FaultSpecError) as err:
        parse_faults(spec)
    assert needle in str(err.value) and "Fix:" in str(err.value)
    assert pickle.loads(pickle.dumps(err.value)).args == err.value.args


def test_guard_config_validates_faults():
    with pytest.raises(FaultSpecError):
        GuardConfig(faults="kill:rank=x,step=1")


def test_injector_fires_once_and_only_on_matching_rank_and_step():
    faults = parse_faults("nan:rank=0,step=2;raise:rank=1,step=3")
    inj = FaultInjector(faults, rank=0, attempt=0)
    assert inj.on_report(1, {"loss": 1.0}) == {"loss": 1.0}
    poisoned = inj.on_report(2, {"loss": 1.0})
    assert poisoned["loss"] != poisoned["loss"]  # NaN
    assert inj.on_report(2, {"loss": 1.0}) == {"loss": 1.0}  # once per run
    other = FaultInjector(faults, rank=1, attempt=0)
    with pytest.raises(InjectedFault, match="rank 1"):
        other.on_report(3, {})


def test_injector_uses_shared_claims_across_restarts():
    claimed: set[str] = set()

    def claim(key: str) -> bool:
        if key in claimed:
            return False
        claimed.add(key)
        return True

    faults = parse_faults("raise:rank=0,step=1")
    with pytest.raises(InjectedFault):
        FaultInjector(faults, rank=0, attempt=0, claim=claim).on_report(1, {})
    # The restarted worker (attempt 1) replays step 1 without the fault firing again.
    FaultInjector(faults, rank=0, attempt=1, claim=claim).on_report(1, {})


def test_attempt_restricted_fault():
    faults = parse_faults("raise:rank=0,step=1,attempt=1")
    FaultInjector(faults, rank=0, attempt=0).on_report(1, {})
    with pytest.raises(InjectedFault):
        FaultInjector(faults, rank=0, attempt=1).on_report(1, {})


def test_hang_with_seconds_returns(monkeypatch):
    import threading

    from rayguard.faults import injector as faults_module

    waits: list[float | None] = []

    class RecordingEvent(threading.Event):
        def wait(self, timeout=None):
            waits.append(timeout)
            return super().wait(timeout)

    monkeypatch.setattr(faults_module, "threading",
                        type("T", (), {"Event": RecordingEvent}))
    (f,) = parse_faults("hang:rank=0,step=0,seconds=0.05")
    assert f.kind == "hang" and f.seconds == 0.05
    fired: list = []
    injector = FaultInjector((f,), rank=0, attempt=0, on_fire=lambda f, step: fired.append(f))
    out: list = []
    caller = threading.Thread(target=lambda: out.append(injector.on_report(0, {"loss": 1.0})))
    caller.start()
    caller.join(timeout=120)
    assert not caller.is_alive(), "a hang with seconds= must return"
    # it fired once, blocked on a real wait of the given seconds, and left the metrics alone
    assert fired == [f] and waits == [0.05] and out == [{"loss": 1.0}]
    assert injector.on_report(0, {"loss": 2.0}) == {"loss": 2.0} and waits == [0.05]


def test_kill_really_kills_a_process():
    import subprocess
    import sys

    code = ("from rayguard.testing import FaultInjector, parse_faults\n"
            "FaultInjector(parse_faults('kill:rank=0,step=1'), rank=0, attempt=0).on_report(1, {})\n"
            "print('survived')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and "survived" not in proc.stdout


def test_the_fault_injected_event_carries_the_faults_own_step(tmp_path, monkeypatch):
    # `kill:...,step=12` fires inside the report of step 12, before the session moved its
    # last step on: the event said step 11.
    import torch

    import rayguard
    from rayguard.train import forwarding as forwarding_mod
    from rayguard.train.context import GuardContext
    from rayguard.train.setup import build_session

    monkeypatch.setattr(forwarding_mod, "_forward", lambda *a, **k: None)  # no Ray Train here
    ctx = GuardContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                       node_id="n0", device=torch.device("cpu"), seed=0, attempt=0,
                       run_dir=str(tmp_path))
    session = build_session(ctx, rayguard.GuardConfig(numa="off"), None,
                            parse_faults("raise:rank=0,step=12"))
    recorded: list[tuple[str, int | None]] = []
    real_record = session.link.record
    monkeypatch.setattr(session.link, "record", lambda kind, detail, *, step=None, **kw: (
        recorded.append((kind, step)), real_record(kind, detail, step=step, **kw)))
    for step in range(12):
        session.report({"loss": 1.0}, step=step)
    with pytest.raises(InjectedFault):
        session.report({"loss": 1.0}, step=12)
    assert [r for r in recorded if r[0] == "fault_injected"] == [("fault_injected", 12)]


# -- where a fault was given: GuardConfig(faults=...) or RAYGUARD_FAULTS ----------------------
def _announced(faults: Any) -> tuple[dict[str, str], list[tuple[str, str, dict[str, Any]]],
                                     FaultInjector]:
    """An injector whose faults announce themselves as a worker's do (the mark left for the
    controller, the ``fault_injected`` event), over a link that keeps both."""
    from rayguard.faults.injector import announcer

    marks: dict[str, str] = {}
    events: list[tuple[str, str, dict[str, Any]]] = []
    link = SimpleNamespace(ctx=SimpleNamespace(attempt=0, rank=0), mark=marks.__setitem__,
                           record=lambda kind, detail, **f: events.append((kind, detail, f)))
    return marks, events, FaultInjector(faults, rank=0, attempt=0,
                                        on_fire=announcer(link, lambda: -1))


@pytest.mark.parametrize(("config", "env", "source"), [
    ("raise:rank=0,step=1", None, "GuardConfig(faults=...)"),
    (None, "raise:rank=0,step=1", "RAYGUARD_FAULTS"),
    ("raise:rank=0,step=1", "kill:rank=1,step=9", "GuardConfig(faults=...)"),
])
def test_an_injected_fault_is_labelled_by_where_it_was_given(config, env, source):
    from rayguard.failures import classify
    from rayguard.faults.spec import faults_from

    marks, events, injector = _announced(faults_from(config, env))
    with pytest.raises(InjectedFault) as err:
        injector.on_report(1, {})
    (mark,) = marks.values()
    failure = classify(err.value, mark)  # what the controller records in worker_died
    assert (failure.label, failure.reason) == ("injected raise", f"injected raise ({source})")
    [(kind, detail, fields)] = events
    assert kind == "fault_injected" and fields["source"] == source and source in detail


def test_a_fault_given_in_both_places_fires_once():
    from rayguard.faults.spec import CONFIG_SOURCE, ENV_SOURCE, faults_from

    faults = faults_from("raise:rank=0,step=1", "raise:rank=0,step=1")
    assert [f.source for f in faults] == [CONFIG_SOURCE, ENV_SOURCE]
    assert faults[0].key == faults[1].key
    marks, events, injector = _announced(faults)
    with pytest.raises(InjectedFault):
        injector.on_report(1, {})
    assert injector.on_report(1, {}) == {} and len(events) == 1
