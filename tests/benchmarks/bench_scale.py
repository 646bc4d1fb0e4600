"""The run coordinator at scale: the real ``RunCoordinator`` (``start_coordinator``) on a local
Ray cluster, and N simulated ranks, 8 a node, each node with its real ``NodeAggregator``
(rayguard.run.agent) talking to the coordinator over Ray. The ranks are coroutines in a few
host actors (no torch); a node's ranks call its aggregator in their own process, as a real
rank calls the agent on its own node. A host's nodes are grouped as the coordinator groups
real agents (rayguard.run.relay): the first of each 32 relays the group's step summaries
and gather batches (rayguard.run.gather_relay), in process here (a real node's batch is a
call to its relay agent, on the nodes' CPUs).

    .venv/bin/python tests/benchmarks/bench_scale.py --ranks 8,64,1024,1100,16384 --json

One JSON line per N, with exactly these keys:

* ``ranks``, ``nodes``;
* ``setup_gather_s``: every rank contributes its set-up facts (a kept gather, as set-up does)
  and has the answer;
* ``commit_gather_s``: every rank contributes a 4-file manifest record (root 0: the others get
  the errors only, as ``protocol.save`` asks) and rank 0 has written the commit (the records
  as JSON, fsynced, renamed into place);
* ``diagnosis_s``: one rank opens a hang diagnosis, every rank sees it open (a long poll per
  node) and answers (one call per node), the decision is recorded and the opener has it;
* ``rendezvous_s``: one rank replaced live: the coordinator opens the next attempt, every
  survivor sees the notice, survivors and the replacement gather their set-up facts for the
  new attempt and read rank 0's process-group address;
* (on stderr, not in the JSON) every rank records one event, waited for: each straight to
  the coordinator (as without node agents), then through its node's outbox
  (rayguard.run.outbox): the span, the coordinator's calls and its CPU seconds, each way;
* (on stderr, with ``--memory``) every rank looks up its memory copy at once, as at a
  restore (rayguard.run.memory_host: the copies on the one real node, no peer, so no
  keeper ping): straight with Ray's node table asked per call (the coordinator before it
  kept the answer ``ALIVE_FRESH_S``), straight, then through its node's aggregator
  (``memory_lookup_many``): the span, the coordinator's calls and its CPU seconds, each way;
* ``coordinator_cpu_frac``: CPU seconds per second of the coordinator's process while every
  rank sends a step summary at 1 Hz (through its node's aggregator) and keeps a long poll of
  the diagnosis fact, for ``--window-s`` (30) seconds; ``calls_per_s``: the calls the
  coordinator received per second in that window (counted where they are sent: every
  aggregator's calls plus rank 0's progress).

The aggregators share their host processes with the simulated ranks, so their CPU is in the
hosts' (printed on stderr as ``hosts_cpu_frac``, not in the JSON). The simulated ranks, the
hosts and the coordinator all share this machine's cores: on a 2-core machine the figures
include that contention. Nodes of one host share one fetch of a gather's answer (a real node
fetches it once, in parallel with every other node). After the last N, the growth of each
figure from 1,024 to 16,384 ranks (when both ran).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from typing import Any

RANKS_PER_NODE = 8


class Host:
    """A host actor: simulated nodes (an aggregator each) and their ranks."""

    def __init__(self, coordinator: Any, nodes: list[int], world: int, run_dir: str) -> None:
        self.coordinator = coordinator
        self.nodes = nodes
        self.world = world
        self.run_dir = run_dir
        self.aggs: dict[int, Any] = {}
        self.fetched: dict[Any, Any] = {}
        self.relays: dict[int, Any] = {}
        self.relayed = 0
        self.groups: dict[int, Any] = {}  # a relay node -> its GroupGather
        self.sides: list[Any] = []  # every node's RelayedGathers
        self.stop = False

    def _agg(self, node: int) -> Any:
        from rayguard.run.agent import SUMMARY_EVERY_S, NodeAggregator, RayUpstream
        from rayguard.run.gather_relay import GroupGather, RelayedGathers
        from rayguard.run.relay import RELAY_NODES, RelayingUpstream, SummaryRelay, relay_of
        from rayguard.run.waits import ErrorsOnly

        host = self

        class SharedFetch(RayUpstream):
            async def resolve(self, out):
                if out is None or isinstance(out, ErrorsOnly):
                    return None if out is None else out.values()
                ref = out[0]
                if ref not in host.fetched:
                    host.fetched[ref] = asyncio.ensure_future(_fetch(ref))
                return await host.fetched[ref]

        if node not in self.aggs:
            upstream = SharedFetch(self.coordinator)
            lead = relay_of(self.nodes.index(node))
            if lead is None:  # this node relays its group's summaries and gathers
                relay = self.relays[node] = SummaryRelay(
                    self.coordinator.step_summaries_nodes.remote, every_s=SUMMARY_EVERY_S)
                send = relay.add
                group = self.groups[node] = GroupGather(upstream.gather_group)
                at = self.nodes.index(node)
                for member in self.nodes[at:at + RELAY_NODES]:  # the agents' starts tell a real relay
                    group.join(f"sim-{member}")
            else:  # a real relay is a call between two agents; here one host holds both
                self._agg(self.nodes[lead])
                send = self._relayed(self.relays[self.nodes[lead]])
                group = self.groups[self.nodes[lead]]
            side = RelayedGathers(upstream, group.gather, node=f"sim-{node}")
            self.sides.append(side)
            self.aggs[node] = NodeAggregator(RelayingUpstream(upstream, send, side),
                                             f"sim-{node}")
        return self.aggs[node]

    def _relayed(self, relay: Any) -> Any:
        def send(batch: list[dict[str, Any]]) -> None:
            self.relayed += 1  # a call to the relay, not to the coordinator
            relay.add(batch)
        return send

    def ranks(self) -> list[int]:
        return [r for n in self.nodes for r in range(n * RANKS_PER_NODE,
                                                     min((n + 1) * RANKS_PER_NODE, self.world))]

    def _local(self, rank: int) -> int:
        node = rank // RANKS_PER_NODE
        return min((node + 1) * RANKS_PER_NODE, self.world) - node * RANKS_PER_NODE

    def sent(self) -> int:
        """Calls to the coordinator: the aggregators' and relays', less the node batches
        of summaries and gathers an aggregator gave its group's relay."""
        return (sum(a.sent for a in self.aggs.values()) - self.relayed
                - sum(s.relayed for s in self.sides)
                + sum(r.sent for r in self.relays.values())
                + sum(g.sent for g in self.groups.values()))

    def gather_calls(self) -> int:
        """The gathers' calls to the coordinator so far (node batches sent straight, and
        the relays' group calls)."""
        return (sum(g.sent for g in self.groups.values())
                + sum(s._count - s.relayed for s in self.sides))

    def cpu(self) -> float:
        t = os.times()
        return t.user + t.system

    async def setup(self, attempt: int) -> tuple[float, float]:
        start = time.time()

        async def rank(r: int) -> None:
            info = {"rank": r, "node_id": f"sim-{r // RANKS_PER_NODE}", "local_rank": r % 8,
                    "gpu_ids": [str(r % 8)], "num_cpus": 1.0, "fractional_gpu": False,
                    "pid": 10000 + r, "setup_start_time": start}
            out = await self._agg(r // RANKS_PER_NODE).gather(
                f"a{attempt}:setup", r, self.world, info, 600.0, True, self._local(r))
            assert out is not None and len(out) == self.world, f"rank {r}: {out!r:.80}"

        await asyncio.gather(*(rank(r) for r in self.ranks()))
        return start, time.time()

    async def commit(self) -> tuple[float, float]:
        start = time.time()

        async def rank(r: int) -> None:
            record = {"rank": r, "files": [
                {"path": f"shard-{r:05d}-{i}.pt", "size": 1 << 20, "blake3": f"{r:060x}{i:04x}"}
                for i in range(4)]}
            out = await self._agg(r // RANKS_PER_NODE).gather(
                "a0:commit:records", r, self.world, record, 600.0, False, self._local(r), 0)
            assert out is not None and len(out) == self.world
            if r == 0:
                assert all(isinstance(o, dict) for o in out)
                path = os.path.join(self.run_dir, "manifest.json")
                with open(path + ".tmp", "w") as f:
                    json.dump({"world_size": self.world, "records": out}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(path + ".tmp", path)

        await asyncio.gather(*(rank(r) for r in self.ranks()))
        return start, time.time()

    async def diagnose(self, opener: bool) -> tuple[float, float]:
        start = time.time()

        async def rank(r: int) -> None:
            agg = self._agg(r // RANKS_PER_NODE)
            if opener and r == 0:
                await self.coordinator.open_diagnosis.remote(0, 0, self.world, 60.0)
            while await agg.wait_fact("diagnosis:0", 30.0) is None:
                pass
            seq = 7 if r else 6  # rank 0 is behind: the culprit
            await agg.answer_diagnosis(0, r, {
                "rank": r, "node": f"sim-{r // 8}", "gpu_ids": [str(r % 8)],
                "groups": {"0": {"entered": {"seq": seq, "op": "all_reduce", "sizes": [[4]]},
                                 "completed": 6}},
                "top_frame": "train.py:42", "stacks": f"/stacks/rank{r}.txt"}, self._local(r))
            if opener and r == 0:
                event = await self.coordinator.await_diagnosis.remote(0, 120.0)
                assert event is not None and event["kind"] == "hang_diagnosed", event

        await asyncio.gather(*(rank(r) for r in self.ranks()))
        return start, time.time()

    async def rendezvous(self, victim: int) -> tuple[float, float]:
        start = time.time()

        async def rank(r: int) -> None:
            agg = self._agg(r // RANKS_PER_NODE)
            if r != victim:  # a survivor: the notice, then set up again
                while await agg.wait_fact("live:0", 30.0) is None:
                    pass
            info = {"rank": r, "node_id": f"sim-{r // 8}", "setup_start_time": start}
            out = await agg.gather("a1:setup", r, self.world, info, 600.0, True, self._local(r))
            assert out is not None and len(out) == self.world
            if r == 0:
                await self.coordinator.put.remote("live:pg:1", ["10.0.0.1", 29500])
            while await agg.wait_fact("live:pg:1", 30.0) is None:
                pass

        await asyncio.gather(*(rank(r) for r in self.ranks()))
        return start, time.time()

    async def events(self, straight: bool) -> tuple[float, float, int]:
        """Every rank records one event at once (a ``rejoined``, as at a live recovery):
        ``straight``, each to the coordinator (as without agents), else through its node's
        outbox (rayguard.run.outbox); waited for, so the span covers their arrival. Returns
        the span and the calls the coordinator received."""
        from rayguard.run.outbox import EVENT, message_id

        start = time.time()
        sent0 = sum(a.outbox.sent for a in self.aggs.values())

        async def rank(r: int) -> None:
            event = {"kind": "rejoined", "detail": f"rank {r} rejoined", "rank": r,
                     "node": f"sim-{r // RANKS_PER_NODE}", "attempt": 1, "time": time.time()}
            if straight:
                await self.coordinator.record.remote(event)
            else:
                await self._agg(r // RANKS_PER_NODE).deliver(EVENT, message_id(), event)

        await asyncio.gather(*(rank(r) for r in self.ranks()))
        calls = (len(self.ranks()) if straight
                 else sum(a.outbox.sent for a in self.aggs.values()) - sent0)
        return start, time.time(), calls

    async def offer(self, path: str, node: str) -> None:
        """Every rank's memory copy of ``path`` offered (one ``deliver`` per node: the
        offers' own cost is not measured here), kept as on ``node``, the one real node."""
        from rayguard.run.outbox import OFFER, message_id

        await asyncio.gather(*(self._agg(r // RANKS_PER_NODE).deliver(
            OFFER, message_id(), (path, 1, r, node, {"w": f"d{r}"}, [r])) for r in self.ranks()))

    async def lookups(self, path: str, straight: bool) -> tuple[float, float, int]:
        """Every rank looks up its memory copy of ``path`` at once (a restore): ``straight``,
        each of the coordinator (as without agents), else through its node's aggregator
        (``memory_lookup_many``). Returns the span and the coordinator calls."""
        start = time.time()
        sent0 = sum(a.lookups.sent for a in self.aggs.values())

        async def rank(r: int) -> None:
            if straight:
                found = await self.coordinator.memory_lookup.remote(path, r)
            else:
                found = await self._agg(r // RANKS_PER_NODE).memory_lookup(path, r)
            assert found is not None and found[1] == {"w": f"d{r}"}, f"rank {r}: {found!r:.80}"

        await asyncio.gather(*(rank(r) for r in self.ranks()))
        calls = (len(self.ranks()) if straight
                 else sum(a.lookups.sent for a in self.aggs.values()) - sent0)
        return start, time.time(), calls

    async def report_for(self, seconds: float) -> int:
        """Every rank: a step summary a second through its aggregator; rank 0 also its
        progress to the coordinator; every node keeps the diagnosis fact's long poll."""
        end = time.monotonic() + seconds
        direct = 0

        async def watch(node: int) -> None:
            agg = self._agg(node)
            while time.monotonic() < end:
                await agg.wait_fact("diagnosis:99", min(30.0, max(0.01, end - time.monotonic())))

        from rayguard.observe.steps import StepTimer

        timer = StepTimer(interval_s=3600.0)
        for step in range(1, 11):  # a real summary's shape: 10 reports, a loss sample each
            timer.on_report(step, {"loss": 1.0 / step}, 0.001)
        template = timer.take()

        async def rank(r: int) -> None:
            nonlocal direct
            agg = self._agg(r // RANKS_PER_NODE)
            step = 0
            await asyncio.sleep((r % 1000) / 1000)  # spread over the second
            while time.monotonic() < end:
                step += 10
                agg.summary({**template, "rank": r, "attempt": 0, "node": f"sim-{r // 8}",
                             "first_step": step - 9, "last_step": step, "time": time.time()})
                if r == 0:
                    self.coordinator.progress.remote({"step": step})
                    direct += 1
                await asyncio.sleep(1.0)

        await asyncio.gather(*(rank(r) for r in self.ranks()), *(watch(n) for n in self.nodes))
        for agg in self.aggs.values():
            agg.flush_summaries()
        for relay in self.relays.values():
            relay.flush()
        return direct


async def _fetch(ref: Any) -> Any:
    return await ref


def _on_loop(fn: Any) -> Any:
    """Run ``fn`` on the coordinator's event-loop thread, where its methods run (a closure
    of ``__ray_call__`` runs on another thread) and wait for its result."""
    import asyncio
    import concurrent.futures
    import gc

    loop = next(o for o in gc.get_objects()
                if isinstance(o, asyncio.AbstractEventLoop) and o.is_running())
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    loop.call_soon_threadsafe(lambda: done.set_result(fn()))
    return done.result(timeout=60)


def _profile_start(actor: Any) -> None:
    """cProfile on the coordinator's event-loop thread (``--profile``): where its own Python
    time goes, apart from Ray's transport (the rest of its process's CPU)."""
    import cProfile

    actor._bench_profile = cProfile.Profile()
    _on_loop(actor._bench_profile.enable)


def _profile_stop(actor: Any, path: str) -> float:
    import pstats

    _on_loop(actor._bench_profile.disable)
    actor._bench_profile.dump_stats(path)
    return pstats.Stats(path).total_tt


def _span(spans: list[tuple[float, float]]) -> float:
    return round(max(e for _, e in spans) - min(s for s, _ in spans), 3)


def _uncached(self: Any, on: bool) -> None:
    """``on``: the coordinator asks Ray's node table at every memory-tier call, as it did
    before it kept the answer (``memory_host.ALIVE_FRESH_S``); else as it does now."""
    import rayguard.run.memory_host as memory_host

    async def per_call() -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, memory_host._alive_nodes)

    if on:
        self._alive = per_call
    else:
        self.__dict__.pop("_alive", None)


def _lookups(coordinator: Any, hosts: list[Any], proc: Any) -> dict[str, Any]:
    """Every rank's restore look-up three ways: straight with Ray's node table asked per
    call (as before it was kept), straight, and per node; span, calls, coordinator CPU."""
    import ray

    node = ray.get_runtime_context().get_node_id()  # every simulated rank's copy: alive
    ray.get([h.offer.remote("mem", node) for h in hosts])
    ray.get(coordinator.memory_commit.remote("mem", 1))
    out: dict[str, Any] = {}
    for name, straight in (("straight_uncached", True), ("straight", True),
                           ("per_node", False)):
        ray.get(coordinator.__ray_call__.remote(_uncached, name == "straight_uncached"))
        cpu0 = sum(proc.cpu_times()[:2])
        done = ray.get([h.lookups.remote("mem", straight) for h in hosts])
        out[name] = {"s": _span([(a, b) for a, b, _ in done]),
                     "coordinator_calls": sum(c for _, _, c in done),
                     "coordinator_cpu_s": round(sum(proc.cpu_times()[:2]) - cpu0, 2)}
    ray.get(coordinator.__ray_call__.remote(_uncached, False))
    return out


def run_one(ranks: int, hosts_n: int, window_s: float, profile: str | None = None,
            memory: bool = False) -> dict[str, Any]:
    import psutil
    import ray

    from rayguard.run.coordinator import start_coordinator
    from rayguard.run.waits import MAX_WAITERS

    run_dir = tempfile.mkdtemp(prefix="bench-scale-")
    coordinator = start_coordinator(os.path.join(run_dir, "events.jsonl"),
                                    observe={"run": "bench", "metrics": None})
    ray.get(coordinator.open_attempt.remote("restart"))
    coord_pid = ray.get(coordinator.__ray_call__.remote(lambda self: os.getpid()))
    nodes = (ranks + RANKS_PER_NODE - 1) // RANKS_PER_NODE
    hosts_n = min(hosts_n, nodes)
    host_cls = ray.remote(Host).options(num_cpus=0, max_concurrency=MAX_WAITERS)
    hosts = [host_cls.remote(coordinator, list(range(i, nodes, hosts_n)), ranks, run_dir)
             for i in range(hosts_n)]
    ray.get([h.ranks.remote() for h in hosts])
    out: dict[str, Any] = {"ranks": ranks, "nodes": nodes}
    proc = psutil.Process(coord_pid)
    phase_cpu: dict[str, float] = {}

    profiled: dict[str, float] = {}

    def start(name: str) -> None:
        if profile:
            ray.get(coordinator.__ray_call__.remote(_profile_start))

    def stop(name: str) -> None:
        if profile:
            path = os.path.join(profile, f"coordinator-{ranks}-{name}.prof")
            profiled[name] = round(ray.get(coordinator.__ray_call__.remote(_profile_stop, path)), 2)

    host_phase_cpu: dict[str, float] = {}
    gather_calls: dict[str, int] = {}

    def timed(name: str, submit: Any) -> list[Any]:
        calls = sum(ray.get([h.gather_calls.remote() for h in hosts]))  # idle: exact
        before = sum(proc.cpu_times()[:2])
        result = ray.get(submit())
        phase_cpu[name] = round(sum(proc.cpu_times()[:2]) - before, 2)
        gather_calls[name] = sum(ray.get([h.gather_calls.remote() for h in hosts])) - calls
        return result

    def hosts_cpu() -> float:
        return sum(ray.get([h.cpu.remote() for h in hosts]))

    start("setup")
    h0 = hosts_cpu()
    out["setup_gather_s"] = _span(timed("setup", lambda: [h.setup.remote(0) for h in hosts]))
    host_phase_cpu["setup"] = round(hosts_cpu() - h0, 2)
    stop("setup")
    start("commit")
    h0 = hosts_cpu()
    out["commit_gather_s"] = _span(timed("commit", lambda: [h.commit.remote() for h in hosts]))
    host_phase_cpu["commit"] = round(hosts_cpu() - h0, 2)
    stop("commit")
    start("diagnosis")
    h0 = hosts_cpu()
    out["diagnosis_s"] = _span(timed("diagnosis", lambda: [h.diagnose.remote(i == 0)
                                                           for i, h in enumerate(hosts)]))
    host_phase_cpu["diagnosis"] = round(hosts_cpu() - h0, 2)
    stop("diagnosis")
    start("rendezvous")
    victim = ranks - 1
    spans = [h.rendezvous.remote(victim) for h in hosts]
    time.sleep(0.2)  # every survivor waits for the notice
    opened = time.time()
    ray.get(coordinator.open_attempt.remote("live", 0, [victim],
                                               "bench: one rank replaced"))
    out["rendezvous_s"] = round(max(e for _, e in ray.get(spans)) - opened, 3)
    stop("rendezvous")
    events: dict[str, Any] = {}
    for straight in (True, False):
        name = "events_straight" if straight else "events_per_node"
        cpu0 = sum(proc.cpu_times()[:2])
        done = ray.get([h.events.remote(straight) for h in hosts])
        events[name] = {"s": _span([(a, b) for a, b, _ in done]),
                        "coordinator_calls": sum(c for _, _, c in done),
                        "coordinator_cpu_s": round(sum(proc.cpu_times()[:2]) - cpu0, 2)}
    print(f"# {ranks} ranks: every rank records one event (waited): {json.dumps(events)}",
          file=sys.stderr, flush=True)
    if memory:
        print(f"# {ranks} ranks: every rank looks up its memory copy (a restore): "
              f"{json.dumps(_lookups(coordinator, hosts, proc))}", file=sys.stderr, flush=True)
    start("steady")
    sent0 = sum(ray.get([h.sent.remote() for h in hosts]))
    host_cpu0 = sum(ray.get([h.cpu.remote() for h in hosts]))
    cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
    direct = sum(ray.get([h.report_for.remote(window_s) for h in hosts]))
    elapsed = time.monotonic() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    stop("steady")
    sent = sum(ray.get([h.sent.remote() for h in hosts])) - sent0
    host_cpu = sum(ray.get([h.cpu.remote() for h in hosts])) - host_cpu0
    out["coordinator_cpu_frac"] = round(cpu / elapsed, 3)
    out["calls_per_s"] = round((sent + direct) / elapsed, 1)
    print(f"# {ranks} ranks: hosts_cpu_frac {host_cpu / elapsed:.3f} (aggregators and "
          f"simulated ranks, {hosts_n} processes); the coordinator's CPU seconds in each "
          f"phase: {json.dumps(phase_cpu)}; the hosts' (simulated ranks and their "
          f"aggregators): {json.dumps(host_phase_cpu)}; gather calls the coordinator "
          f"received: {json.dumps({k: v for k, v in gather_calls.items() if k != 'diagnosis'})}",
          file=sys.stderr, flush=True)
    if profile:
        print(f"# {ranks} ranks: the coordinator's event-loop thread under cProfile, seconds "
              f"per phase (with the profiler's own cost; files in {profile}): "
              f"{json.dumps(profiled)}", file=sys.stderr, flush=True)
    for h in hosts:
        ray.kill(h)
    ray.get(coordinator.close.remote())
    ray.kill(coordinator)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,64,1024,1100,16384")
    parser.add_argument("--hosts", type=int, default=4, help="host processes of the ranks")
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--json", action="store_true", help="JSON lines only on stdout")
    parser.add_argument("--memory", action="store_true",
                        help="also every rank's restore look-up, straight and per node "
                             "(printed on stderr)")
    parser.add_argument("--profile", metavar="DIR",
                        help="cProfile the coordinator's event loop in each phase into DIR")
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        row = run_one(n, args.hosts, args.window_s, args.profile, args.memory)
        rows.append(row)
        print(json.dumps(row) if args.json else
              "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    by = {r["ranks"]: r for r in rows}
    if 1024 in by and 16384 in by:
        growth = {k: round(by[16384][k] / by[1024][k], 2) if by[1024][k] else None
                  for k in by[1024] if k not in ("ranks", "nodes")}
        print(f"# growth 1,024 -> 16,384 ranks (x16): {json.dumps(growth)}", file=sys.stderr)
    print(f"# {os.cpu_count()} cores shared by the coordinator, the hosts and Ray",
          file=sys.stderr)
    ray.shutdown()


if __name__ == "__main__":
    main()
