"""Where a rank's collective state comes from, on real gloo process groups (two spawned
processes): torch's Flight Recorder (DDP's C++ reducer included) and rayguard's counting
hook (which does not see the reducer); and the recorder's dump parsed as plain data."""

from __future__ import annotations

import os
import socket

import pytest

from rayguard._torch import counting, flight_recorder
from rayguard.health.hang import top_frame


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, out_dir, hook):
    import datetime
    import json

    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    if hook:
        counting.install()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    ddp(torch.ones(3, 4)).sum().backward()  # the reducer's all-reduce of one 10-float bucket
    dist.barrier()
    import time

    for _ in range(100):  # the recorder marks a gloo collective completed from its own thread
        fr = flight_recorder.collective_state()
        if all(g["entered"] is None or g["completed"] == g["entered"]["seq"] for g in fr.values()):
            break
        time.sleep(0.05)
    state = {"fr": fr, "hook": counting.collective_state()}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(state, f)
    dist.barrier()  # both states are written: neither rank leaves before the other's is
    # The process leaves without tearing down its group, the DDP reducer and the recorder:
    # that teardown once aborted one rank (std::terminate, "terminate called without an
    # active exception") on a loaded machine after both states were written; it is torch's
    # exit path, not what this test proves.
    os._exit(0)


def _run(tmp_path, hook):
    import json

    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(_port(), str(tmp_path), hook), nprocs=2, join=True)
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.timeout(240)
def test_the_recorder_sees_every_collective_and_the_hook_all_but_the_reducers(tmp_path):
    states = _run(tmp_path, hook=True)  # one spawn serves both sources (they run side by side)
    for state in states:
        group = state["hook"]["0"]
        # all_reduce, broadcast, barrier: 3 (DDP's broadcast of the parameters at its
        # construction and its gradient all-reduce go through the C++ side: not seen)
        assert group["entered"] == {"seq": 3, "op": "barrier", "sizes": []}
        assert group["completed"] == 3
    assert states[0]["hook"] == states[1]["hook"]
    if not flight_recorder.available():
        pytest.skip("this torch's Flight Recorder does not record gloo")
    for state in states:
        group = state["fr"]["0"]
        ops_seen = group["entered"]["seq"]
        assert ops_seen > 3  # the reducer's all-reduce and DDP's set-up collectives too
        assert group["completed"] == group["entered"]["seq"]  # nothing in flight at the end
    assert states[0]["fr"] == states[1]["fr"]  # the same seq on every rank


def test_a_dump_is_parsed_per_group_with_the_last_entry():
    dump = {
        "pg_config": {"1": {"name": "1", "desc": "side", "ranks": "[0, 2]"}},
        "pg_status": {"0": {"last_enqueued_collective": 7, "last_completed_collective": 6},
                      "1": {"last_enqueued_collective": 2, "last_completed_collective": -1}},
        "entries": [
            {"process_group": ("0", "default_pg"), "collective_seq_id": 6,
             "profiling_name": "gloo:all_reduce", "input_sizes": [[10]]},
            {"process_group": ("0", "default_pg"), "collective_seq_id": 7,
             "profiling_name": "nccl:broadcast", "input_sizes": [[4], [2]]},
            {"process_group": ("1", "side"), "collective_seq_id": 0, "is_p2p": True,
             "profiling_name": "gloo:send"},
        ],
    }
    assert flight_recorder.parse(dump) == {
        "0": {"entered": {"seq": 7, "op": "broadcast", "sizes": [[4], [2]]}, "completed": 6,
              "ranks": []},
        # the ring buffer no longer holds the entry: the seq is known, the op is not
        "1": {"entered": {"seq": 2, "op": "collective", "sizes": []}, "completed": 0,
              "ranks": [0, 2]},
    }
    assert flight_recorder.parse({}) == {}


def test_the_recorder_is_off_when_its_buffer_is_zero(monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert not flight_recorder.available()
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    assert flight_recorder.available() == any(hasattr(__import__(
        "torch._C._distributed_c10d", fromlist=["x"]), n) for n in flight_recorder._DUMPERS)


def test_the_hook_counts_nested_calls_once_and_failed_calls_as_not_completed():
    import types

    counter = counting.Counter()
    calls: list[str] = []

    def all_reduce(tensor, group=None):
        calls.append("all_reduce")

    def broadcast_object_list(objs, src=0, group=None):
        module.all_reduce(objs)  # torch's own helpers call other collectives

    def barrier(group=None):
        raise RuntimeError("peer gone")

    module = types.SimpleNamespace(all_reduce=all_reduce, barrier=barrier,
                                   broadcast_object_list=broadcast_object_list)
    assert counting.install(counter, module) and not counting.install(counter, module)
    module.broadcast_object_list([1])
    assert counter.state()["0"]["entered"]["seq"] == 1  # the nested all_reduce not counted
    module.all_reduce(types.SimpleNamespace(shape=(3, 2)), group=types.SimpleNamespace(
        group_name="7"))
    assert counter.state()["7"] == {"entered": {"seq": 1, "op": "all_reduce", "sizes": [[3, 2]]},
                                    "completed": 1, "ranks": []}
    with pytest.raises(RuntimeError):
        module.barrier()
    assert counter.state()["0"]["entered"]["seq"] == 2 and counter.state()["0"]["completed"] == 1
    counting.uninstall(module)
    assert module.all_reduce is all_reduce


def test_the_top_frame_is_the_users_line_of_the_thread():
    import threading

    here = threading.get_ident()
    frame = top_frame(here)
    assert frame is not None and "test_collective_sources.py" in frame
    assert frame.endswith("in test_the_top_frame_is_the_users_line_of_the_thread")
    assert top_frame(None) is None and top_frame(-1) is None


def test_a_users_folder_named_rayguard_or_torch_is_still_the_users(tmp_path):
    """Only rayguard's and torch's own package folders are looked past, not any folder of
    that name: a loop whose code lives in ``.../rayguard/`` gets its own line."""
    import threading

    for name in ("rayguard", "torch"):
        folder = tmp_path / name
        folder.mkdir()
        source = folder / "train_loop.py"
        source.write_text("def my_loop(top_frame, ident):\n    return top_frame(ident)\n")
        code = compile(source.read_text(), str(source), "exec")
        scope: dict = {}
        exec(code, scope)  # noqa: S102 - the test's own file, to get a frame in that folder
        frame = scope["my_loop"](top_frame, threading.get_ident())
        assert frame is not None and frame.startswith(str(source)), frame
        assert frame.endswith("in my_loop")
