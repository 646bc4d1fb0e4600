import pickle

import pytest

from rayguard.exceptions import WorkerSetupError
from rayguard.placement.cuda import PinnedWorker, check_unique_devices, resolve_cuda_device


def test_cpu_worker_has_no_ordinal():
    p = resolve_cuda_device([], None, 0)
    assert p.ordinal is None and p.device == "cpu"


def test_ray_shares_local_gpus_so_index_is_position_not_local_rank():
    # Ray Train sets CUDA_VISIBLE_DEVICES="1,3" on both local workers; this one owns GPU 3.
    p = resolve_cuda_device(["3"], "1,3", 2, rank=0, node="n1")
    assert p.ordinal == 1 and p.device == "cuda:1"


def test_unset_visible_uses_physical_ids():
    assert resolve_cuda_device([2], None, 4).ordinal == 2


def test_several_gpus_per_worker_primary_first():
    p = resolve_cuda_device(["6", "4"], "4,5,6,7", 4)
    assert p.ordinal == 2 and p.ordinals == (2, 0)


def test_uuid_form():
    vis = "GPU-aaaa,GPU-bbbb"
    assert resolve_cuda_device(["GPU-bbbb"], vis, 2).ordinal == 1


def test_mig_form():
    vis = "MIG-GPU-aaaa/1/0,MIG-GPU-aaaa/2/0"
    assert resolve_cuda_device(["MIG-GPU-aaaa/2/0"], vis, 1 + 1).ordinal == 1


def test_fractional_gpu_same_id_for_two_workers_is_fine():
    a = resolve_cuda_device(["0"], "0", 1, rank=0)
    b = resolve_cuda_device(["0"], "0", 1, rank=1)
    assert a.ordinal == b.ordinal == 0
    check_unique_devices([PinnedWorker(0, "n", ("0",), True), PinnedWorker(1, "n", ("0",), True)])


def test_two_whole_gpu_workers_on_one_gpu_is_an_error():
    with pytest.raises(WorkerSetupError, match="ranks 0 and 1 on node n both resolve to GPU 0"):
        check_unique_devices([PinnedWorker(0, "n", ("0",)), PinnedWorker(1, "n", ("0",))])
    # Same id on different nodes is two GPUs.
    check_unique_devices([PinnedWorker(0, "a", ("0",)), PinnedWorker(1, "b", ("0",))])


def test_duplicate_in_visible_devices():
    with pytest.raises(WorkerSetupError, match=r"lists \['1'\] more than once"):
        resolve_cuda_device(["1"], "0,1,1", 3, rank=2, node="n7")


def test_duplicate_assigned_ids():
    with pytest.raises(WorkerSetupError, match="duplicate GPU ids"):
        resolve_cuda_device(["1", "1"], "0,1", 2)


def test_assigned_id_not_visible_names_rank_node_ids_and_fix():
    with pytest.raises(WorkerSetupError) as err:
        resolve_cuda_device(["5"], "0,1", 2, rank=3, node="node-a")
    msg = str(err.value)
    assert "rank 3 on node node-a" in msg and "['5']" in msg and "Fix:" in msg


def test_ordinal_out_of_range():
    with pytest.raises(WorkerSetupError, match="ordinal 3"):
        resolve_cuda_device(["3"], None, 2, rank=1, node="n")
    with pytest.raises(WorkerSetupError, match="sees 1 CUDA device"):
        resolve_cuda_device(["1"], "0,1", 1)


def test_uuid_id_without_visible_devices_is_an_error():
    with pytest.raises(WorkerSetupError, match="only integer ids"):
        resolve_cuda_device(["GPU-aaaa"], None, 1)


def test_errors_pickle():
    try:
        resolve_cuda_device(["9"], "0", 1, rank=0, node="n")
    except WorkerSetupError as e:
        again = pickle.loads(pickle.dumps(e))
        assert str(again) == str(e)
