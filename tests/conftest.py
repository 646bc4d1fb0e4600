"""Shared fixtures. Ray start-up costs seconds, so one local cluster serves every test that
needs a plain one; multi-node tests shut it down and start their own
(``ray.cluster_utils.Cluster``), as do modules marked ``own_cluster`` (a local instance with
settings of their own): they are run after all the others (see
``pytest_collection_modifyitems``), so the shared cluster is started once. The exact-recovery
tests share one fault-free run (``exact_clean``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


_SHARED_TMP = "/tmp"
"""The machine's temporary directory, before a pytest-xdist worker set its own."""


def _own_temp_dir_per_xdist_worker() -> None:
    """Under pytest-xdist every worker process gets a temporary directory of its own before
    anything reads it: Ray's session folder and ``ray_current_cluster`` record, rayguard's
    per-user spares folder and the tests that plant files there are per machine otherwise,
    so two workers' clusters would see each other's (as two users' runs on one node do)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    import tempfile

    global _SHARED_TMP
    _SHARED_TMP = tempfile.gettempdir()
    path = os.path.join(_SHARED_TMP, f"rg-{worker}-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = None  # read TMPDIR again


_own_temp_dir_per_xdist_worker()


def _no_deadlines() -> None:
    """Hypothesis's per-example deadline (200 ms) and too-slow health check are time limits;
    the tests never assert on wall time, and two worker processes share the cores."""
    from hypothesis import HealthCheck, settings

    settings.register_profile("rayguard", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("rayguard")


_no_deadlines()

LOCAL_NUM_CPUS = 4  # logical: two training workers + room for tasks/actors beside them
OBJECT_STORE_BYTES = 512 * 1024**2


def start_local_ray(num_cpus: int = LOCAL_NUM_CPUS, **kwargs):
    import ray

    if ray.is_initialized():
        return ray
    ray.init(
        address="local",  # never attach to another cluster on this machine
        num_cpus=num_cpus,
        object_store_memory=OBJECT_STORE_BYTES,
        include_dashboard=False,
        log_to_driver=True,
        **kwargs,
    )
    return ray


@pytest.fixture
def ray_local():
    """A local single-node Ray cluster (shared; started on first use)."""
    ray = start_local_ray()
    yield ray


@pytest.fixture(scope="module")
def ray_local_module():
    """The same shared local cluster, for module-scoped fixtures."""
    ray = start_local_ray()
    yield ray


EXACT_STEPS = 10
"""The steps of the recovery tests' fault-free reference run (``exact_clean``)."""


@pytest.fixture(scope="session")
def exact_clean(tmp_path_factory):
    """Rank 0's final weights of :func:`rayguard.testing.exact_loop.exact_loop` run for
    ``EXACT_STEPS`` on 2 workers without faults (seed 0): the run every exact-recovery test
    of that loop compares with, made once per pytest run on a shared cluster (its weights do
    not depend on the recovery path or checkpoint mode: the tests' runs prove that). Under
    pytest-xdist the first worker to need it makes it; the others wait for it and load it
    from the run's own base folder."""
    import torch
    from filelock import FileLock

    from rayguard.testing.exact_loop import fit_exact

    def make():
        start_local_ray()
        weights, events, _ = fit_exact(tmp_path_factory.mktemp("exact-clean"), "clean",
                                       steps=EXACT_STEPS)
        assert "restart" not in [e["kind"] for e in events]
        return weights

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make()
    shared = tmp_path_factory.getbasetemp().parent  # this pytest run's, every worker's
    with FileLock(str(shared / "exact_clean.lock")):
        saved = shared / "exact_clean.pt"
        if saved.exists():
            return torch.load(saved, weights_only=True)
        weights = make()
        torch.save(weights, saved)
        return weights


@pytest.fixture
def no_ray():
    """Tests that must start their own cluster call this first."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield


class CliRun(NamedTuple):
    """What one ``rayguard`` command did: its exit status and what it printed."""

    rc: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """``run_cli(argv, env=None, cwd=None) -> CliRun``: ``rayguard <argv>`` run in this
    process (``rayguard.cli.main``), without the seconds an interpreter start costs. ``env``
    is set (``monkeypatch.setenv``) and ``cwd`` entered for the command only; argparse's
    ``SystemExit`` (usage errors, ``--help``) becomes the exit status, as in a shell. A
    subprocess is for what needs the process boundary (``tests/unit/cli/test_cli_smoke.py``)."""
    from rayguard.cli import main

    def run(argv: Sequence[object], env: Mapping[str, str] | None = None,
            cwd: str | Path | None = None) -> CliRun:
        with monkeypatch.context() as patch:
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            if cwd is not None:
                patch.chdir(cwd)
            capsys.readouterr()  # what the test printed before is not the command's
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as exc:
                rc = _exit_status(exc.code)
            out, err = capsys.readouterr()
        return CliRun(rc, out, err)

    return run


def _exit_status(code: object) -> int:
    """The status a process exiting with ``SystemExit(code)`` gives its shell."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): printed, status 1
    return 1


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


RAY_TEST_TIMEOUT_S = 900
"""Per-test limit for tests that start Ray clusters (the global one, 300 s, is for the rest).
On a 2-core machine with another CPU-heavy job beside the suite, starting a worker group alone
was measured at 2.5 minutes, so a test with a kill and a restart can pass 300 s without any
hang; a real hang still fails, at 15 minutes."""


OWN_CLUSTER_FILES = frozenset(f"tests/ray/test_{name}.py" for name in (
    "doctor_cluster", "elastic_cluster", "foreign_cluster", "memory_peer", "memory_tier",
    "numa_trainer", "observe_run", "quarantine_cluster", "scale_workers", "sharded_elastic",
    "straggler_eviction"))
"""The files with tests that start a cluster of their own (``no_ray``) or restart the local
one with settings of their own (``own_cluster``). Under pytest-xdist (``make test``) they are
one unit of work: one worker process runs them one after another, never two multi-node
clusters at once, while the other worker takes the unit tests, then the shared cluster's
files."""


FILE_SECONDS = {f"tests/ray/test_{name}.py": s for name, s in (
    ("ray_report_loops", 300), ("live_replace", 200), ("recovery_exact", 150),
    ("frameworks_transformers", 126), ("user_loop", 119), ("frameworks_lightning", 118),
    ("sharded_checkpoint", 110), ("divergence", 93), ("frameworks_accelerate", 90),
    ("rollback_live", 81), ("checkpoint_remote", 80), ("job_submit", 70),
    ("tune_robust_trainer", 70), ("drop_in", 66), ("checkpoint_async", 64), ("torchft", 60),
    ("crash_loop", 57), ("checkpoint_trainer", 54), ("quickstart_readme", 52),
    ("hang_diagnosis", 52), ("cli_connect", 50), ("preemption", 40), ("doctor_trainer", 39),
    ("observe_straggler", 37), ("startup_bound", 31))}
"""The shared cluster's slowest files, seconds of their tests in one ``make test`` (pytest's
``--durations=0``). Under pytest-xdist they are handed out longest first, so that the last
files given out are short ones and neither worker ends long before the other; a file not
listed comes after them in collection order. Stale figures only change that order."""


def _own_cluster_rank(item) -> int:
    """2: starts its own cluster (``no_ray``); 1: restarts the local one with settings of its
    own (``own_cluster``); 0: runs on the shared local cluster."""
    return (2 * ("no_ray" in getattr(item, "fixturenames", ()))
            + (item.get_closest_marker("own_cluster") is not None))


def _test_file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].replace("\\", "/")


def _is_unit_file(file: str) -> bool:
    return file.startswith("tests/unit/")


def _is_unit(item) -> bool:
    return _is_unit_file(_test_file(item.nodeid))


def _unit_order(item) -> int:
    """Under pytest-xdist, the units of work in the order they are handed out: the
    own-cluster files, then the unit tests, then the shared cluster's files."""
    return 0 if _test_file(item.nodeid) in OWN_CLUSTER_FILES else 1 if _is_unit(item) else 2


def pytest_collection_modifyitems(config, items):
    # Tests that start their own cluster (``no_ray``, or an ``own_cluster`` module that
    # restarts the local one with its own settings) shut the shared one down, and the next
    # ``ray_local`` test starts it again. Run in one process they come last, in their files'
    # order, so the shared cluster starts once, and the unit tests first (before Ray's
    # threads); under pytest-xdist the order is ``_unit_order``'s, the shared cluster's
    # slowest files first (``FILE_SECONDS``), and each worker has a shared cluster.
    strays = sorted({_test_file(i.nodeid) for i in items if _own_cluster_rank(i)
                     and _test_file(i.nodeid).startswith("tests/ray/")} - OWN_CLUSTER_FILES)
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)}: tests that start their own cluster "
                                "(no_ray, own_cluster); add the file to OWN_CLUSTER_FILES in "
                                "tests/conftest.py")
    root = Path(__file__).resolve().parent.parent
    gone = sorted(f for f in OWN_CLUSTER_FILES | FILE_SECONDS.keys() if not (root / f).exists())
    if gone:
        raise pytest.UsageError(f"{', '.join(gone)}: no such file; remove it from "
                                "OWN_CLUSTER_FILES or FILE_SECONDS in tests/conftest.py")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda i: (_unit_order(i), -FILE_SECONDS.get(_test_file(i.nodeid), 0),
                                  i.get_closest_marker("alone") is None, _own_cluster_rank(i)))
    else:
        items.sort(key=lambda i: (not _is_unit(i), _own_cluster_rank(i)))
    for item in items:
        if "tests/ray/" in item.nodeid.replace("\\", "/") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(RAY_TEST_TIMEOUT_S))
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker 'gpu')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)  # before xdist's own choice
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the own-cluster files as one unit (``OWN_CLUSTER_FILES``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OwnClustersTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = _test_file(nodeid)
            if _is_unit_file(file):
                return "unit-tests"
            return "own-clusters" if file in OWN_CLUSTER_FILES else file

    return OwnClustersTogether(config, log)


@contextlib.contextmanager
def _machine_share(alone: bool) -> Iterator[None]:
    """Under pytest-xdist, a test marked ``alone`` (one that fills the machine: 16 worker
    processes on 2 cores) runs with no other Ray test beside it, set-up included: it waits
    for the other workers' tests to end and holds theirs back (the unit tests, which start
    no cluster, take no share: the ``alone`` test is sorted first in its worker, beside
    them). File locks shared by the run's workers: a turnstile, so that a waiting ``alone``
    test is not passed by new tests, and the share itself (shared by ordinary tests,
    exclusive for an ``alone`` one)."""
    import fcntl

    base = os.path.join(_SHARED_TMP, f"rayguard-tests-{os.getuid()}-"
                        f"{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'run')}")
    with open(base + ".turnstile", "a") as gate, open(base + ".share", "a") as share:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(share, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(share, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


LEFTOVER_WAIT_S = 10.0
"""How long a placement group made during a test may stay held after the test ends (Ray
removes a finished run's groups asynchronously) before it is reported as left over."""

_left_over: list[str] = []  # "<test>: <placement groups>", this process's
_seen_groups: set[str] = set()


def _held_groups() -> dict[str, str]:
    """The connected cluster's placement groups that hold resources: id -> a short
    description (bundles, name); empty without a cluster in this process."""
    import ray

    if not ray.is_initialized():
        return {}
    try:
        table = ray.util.placement_group_table()
    except Exception:
        return {}
    return {pid: f"{pg.get('name') or pid[:8]} {pg.get('bundles')}"
            for pid, pg in table.items() if pg.get("state") == "CREATED"}


def _held_beyond(earlier: set[str], wait_s: float) -> dict[str, str]:
    """The held placement groups not in ``earlier``, after waiting up to ``wait_s`` for
    them to go (Ray removes a finished run's groups asynchronously)."""
    import time

    deadline = time.monotonic() + wait_s
    while (new := {k: v for k, v in _held_groups().items() if k not in earlier}) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return new


@pytest.fixture
def groups_left():
    """``groups_left(wait_s=30) -> {id: description}``: the placement groups made since the
    test began that are still held, after waiting up to ``wait_s`` for them to go (Ray
    removes a finished run's groups asynchronously)."""
    earlier = set(_held_groups())

    def left(wait_s: float = 30.0) -> dict[str, str]:
        return _held_beyond(earlier, wait_s)

    return left


@contextlib.contextmanager
def _reports_left_over_groups(nodeid: str) -> Iterator[None]:
    """A test on a shared cluster leaves it as it found it: a placement group made during
    the test and still held ``LEFTOVER_WAIT_S`` after it ended reserves CPUs that the next
    tests wait for; it is named in the run's summary (``pytest_terminal_summary``)."""
    _seen_groups.update(_held_groups())
    yield
    if new := _held_beyond(_seen_groups, LEFTOVER_WAIT_S):
        _left_over.append(f"{nodeid}: {'; '.join(sorted(new.values()))}")
        _seen_groups.update(new)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _is_unit(item):  # no cluster, no bound on a worker's start: beside anything
        yield
        return
    with contextlib.ExitStack() as stack:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            stack.enter_context(_machine_share(item.get_closest_marker("alone") is not None))
        stack.enter_context(_reports_left_over_groups(item.nodeid))
        yield


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: to the controller
        session.config.workeroutput["rayguard_left_over"] = list(_left_over)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_testnodedown(node, error):
    _left_over.extend(getattr(node, "workeroutput", {}).get("rayguard_left_over", ()))


def pytest_terminal_summary(terminalreporter):
    if _left_over:
        terminalreporter.section("placement groups left held after their test")
        for line in _left_over:
            terminalreporter.write_line(line)
