"""One worker's state is its runtime's (rayguard.runtime): two workers in one process, each in
its own thread with its own runtime bound, never see each other's; the threads a worker
starts through ``carry``/``pool`` see its own; code with none bound sees the default."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from rayguard import runtime
from rayguard.checkpoint import auth, fsio, schemes
from rayguard.health.divergence import offer_data_skip, take_data_skip
from rayguard.train.context import GuardContext, get_context, set_context
from rayguard.train.session import current_session, set_current_session


def _ctx(rank: int) -> GuardContext:
    return GuardContext(rank=rank, local_rank=rank, world_size=2, local_world_size=2,
                        node_rank=0, node_id="n", device=None, seed=None, attempt=0,
                        run_dir="/r")


def _in_two_workers(body: Callable[[int], Any]) -> list[Any]:
    """``body(rank)`` in two threads at once, each with its own runtime bound."""
    results: list[Any] = [None, None]

    def run(rank: int) -> None:
        with runtime.bind(runtime.WorkerRuntime()):
            try:
                results[rank] = body(rank)
            except BaseException as exc:  # the assertion below names it
                results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_two_workers_in_one_process_each_see_only_their_own_state():
    """Both workers set everything, wait for each other, then read: with module globals the
    second writer's values would be what both read."""
    both_set = threading.Barrier(2, timeout=30)
    scheme = (schemes.SHA256, schemes.BLAKE3)
    keys = (auth.Key(b"a" * 32, "zero"), auth.Key(b"b" * 32, "one"))

    def body(rank: int) -> tuple[Any, ...]:
        session, hook = object(), (lambda name, path, rank=rank: None)
        set_context(_ctx(rank))
        set_current_session(session)
        schemes.select(scheme[rank])
        auth.use(keys[rank])
        fsio.set_phase_hook(hook)
        offer_data_skip(10 + rank)
        both_set.wait()
        return (get_context().rank == rank, current_session() is session,
                schemes.current() == scheme[rank], auth.active() is keys[rank],
                runtime.current().phase_hook is hook, take_data_skip() == 10 + rank)

    assert _in_two_workers(body) == [(True,) * 6, (True,) * 6]
    assert runtime.current().session is None and runtime.current().phase_hook is None


def test_a_write_fault_hook_fails_only_its_own_workers_writes(tmp_path):
    both_set = threading.Barrier(2, timeout=30)

    def body(rank: int) -> str:
        path = str(tmp_path / f"shard{rank}")
        with fsio.inject_write_error(errno.ENOSPC) if rank == 0 else nullcontext():
            both_set.wait()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                fsio.write_all(fd, [memoryview(b"x" * 8)], path, 0)
                return "written"
            except OSError as exc:
                return errno.errorcode[exc.errno]
            finally:
                os.close(fd)
                both_set.wait()  # the hook stays installed until both have written

    assert _in_two_workers(body) == ["ENOSPC", "written"]


def test_a_thread_started_with_carry_sees_its_starters_runtime_a_plain_one_the_default():
    mine = runtime.WorkerRuntime(hash_scheme=schemes.SHA256)
    seen: dict[str, Any] = {}
    with runtime.bind(mine):
        carried = threading.Thread(target=runtime.carry(lambda: seen.update(c=runtime.current())))
        plain = threading.Thread(target=lambda: seen.update(p=runtime.current()))
        carried.start(), plain.start()
        carried.join(30), plain.join(30)
    assert seen["c"] is mine
    assert seen["p"] is runtime.default()  # why rayguard's threads go through carry


def test_a_pools_threads_see_the_runtime_of_its_creator():
    mine = runtime.WorkerRuntime()
    with runtime.bind(mine), runtime.pool(2, "rg-test") as pool:
        seen = [f.result(30) for f in [pool.submit(runtime.current) for _ in range(8)]]
    assert all(r is mine for r in seen)


def test_unbound_code_sees_the_default_and_a_binding_ends_with_its_block():
    assert runtime.current() is runtime.default()
    mine = runtime.WorkerRuntime()
    with runtime.bind(mine):
        assert runtime.current() is mine
        with runtime.bind(other := runtime.WorkerRuntime()):
            assert runtime.current() is other
        assert runtime.current() is mine
    assert runtime.current() is runtime.default()


def test_the_first_worker_of_a_process_runs_on_the_default_runtime_a_second_on_its_own():
    """A Ray worker (alone in its process) keeps the default, so that threads rayguard did
    not start still see its state; a second worker at the same time gets a new one; a worker
    whose harness bound a runtime keeps that one."""
    with runtime.worker() as first:
        assert first is runtime.default()
        second: list[Any] = []
        t = threading.Thread(target=lambda: second.append(_worker_runtime()))
        t.start()
        t.join(30)
        assert second[0] is not runtime.default()
    with runtime.worker() as again:  # released at the end of the first
        assert again is runtime.default()
    harness = runtime.WorkerRuntime()
    with runtime.bind(harness), runtime.worker() as bound:
        assert bound is harness


def _worker_runtime() -> runtime.WorkerRuntime:
    with runtime.worker() as rt:
        assert runtime.current() is rt
        return rt



def test_rayguards_own_background_threads_see_the_runtime_of_the_worker_that_made_them():
    """The async checkpoint's persist thread, the report forwarder, the watchdog's tick and
    the memory tier's peer-copy thread: each started in a bound worker sees its runtime."""
    from rayguard.health.config import HealthConfig
    from rayguard.health.watchdog import Watchdog
    from rayguard.train import memory_peer
    from rayguard.train.async_checkpoint import AsyncCheckpointer
    from rayguard.train.forwarder import Forwarder

    mine = runtime.WorkerRuntime()
    seen: dict[str, Any] = {}
    ticked = threading.Event()

    class Link:
        ctx = _ctx(0)

        def memory_copy_to_peer(self, final: str) -> None:
            seen["peer"] = runtime.current()

    with runtime.bind(mine):
        persist = AsyncCheckpointer(pin_memory=False)
        persist.submit(lambda: seen.update(persist=runtime.current()))
        forwarder = Forwarder()
        forwarder.submit(lambda: seen.update(forwarder=runtime.current())).result(30)
        watchdog = Watchdog(HealthConfig(), on_stall=lambda d: None,
                            on_tick=lambda: (seen.update(watchdog=runtime.current()),
                                             ticked.set()))
        watchdog.start()
        memory_peer.queue_peer_copy(Link(), "c1")
        memory_peer.wait_idle(30)
        persist.drain(30)
    try:
        assert ticked.wait(30)
    finally:
        watchdog.stop()
        forwarder.close(30)
    assert seen == dict.fromkeys(("persist", "forwarder", "watchdog", "peer"), mine)
    assert mine.peer_thread is None and runtime.default().peer_thread is None
