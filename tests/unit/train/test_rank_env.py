import pytest

from rayguard.exceptions import WorkerSetupError
from rayguard.train.context import GuardContext
from rayguard.train.setup import check_rank_env


def _ctx(rank=1, world=2, local=1, local_world=2):
    return GuardContext(rank=rank, local_rank=local, world_size=world, local_world_size=local_world,
                        node_rank=0, node_id="n1", device="cpu", seed=None, attempt=0, run_dir="/x")


def test_consistent_env_passes():
    check_rank_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, _ctx())
    check_rank_env({}, _ctx())


@pytest.mark.parametrize("env, needle", [
    ({"RANK": "3"}, "RANK=3 but Ray Train assigned 1"),
    ({"WORLD_SIZE": "four"}, "WORLD_SIZE='four' is not an integer"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK=0 but Ray Train assigned 1"),
])
def test_inconsistent_env_stops_with_a_message(env, needle):
    with pytest.raises(WorkerSetupError) as err:
        check_rank_env(env, _ctx())
    assert needle in str(err.value) and "rank 1 on node n1" in str(err.value)
    assert "Fix:" in str(err.value)


def test_rank_outside_world():
    with pytest.raises(WorkerSetupError, match="rank 2 outside world size 2"):
        check_rank_env({}, _ctx(rank=2))
