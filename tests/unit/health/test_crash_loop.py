"""The crash-loop rule on plain records (no Ray): what repeats is not retried, what makes
durable progress or dies is."""

from rayguard.health.crash_loop import FailureRecord, crash_loop, describe_exception


def rec(attempt, rank=0, origin="train.py:3 in train_fn", step=-1, commits=0, kind="builtins.ValueError"):
    return FailureRecord(rank=rank, attempt=attempt, error_type=kind, origin=origin, step=step,
                         commits=commits, summary="ValueError: my bug")


def test_same_error_twice_with_no_progress_is_a_loop():
    history = {0: [rec(0)], 1: [rec(1)]}
    assert crash_loop(history, 1, failed_ranks=1, retries=1) == rec(1)
    assert crash_loop(history, 0, failed_ranks=1, retries=1) is None  # first failure: retry
    assert crash_loop(history, 1, failed_ranks=1, retries=2) is None  # two repeats allowed


def test_zero_retries_stops_at_the_first_exception():
    assert crash_loop({0: [rec(0)]}, 0, failed_ranks=1, retries=0) == rec(0)


def test_progress_between_failures_is_not_a_loop_unless_at_the_same_step():
    moved = {0: [rec(0, step=5)], 1: [rec(1, step=12, commits=1)]}
    assert crash_loop(moved, 1, failed_ranks=1, retries=1) is None
    same_step = {0: [rec(0, step=9, commits=2)], 1: [rec(1, step=9, commits=1)]}
    assert crash_loop(same_step, 1, failed_ranks=1, retries=1) is not None


def test_other_origin_type_or_rank_is_not_a_loop():
    for other in (rec(1, origin="train.py:9 in f"), rec(1, kind="builtins.KeyError"), rec(1, rank=1)):
        assert crash_loop({0: [rec(0)], 1: [other]}, 1, failed_ranks=1, retries=1) is None


def test_an_attempt_with_a_dead_worker_is_never_a_loop():
    # rank 1 died (no record); rank 0's error is collateral, even if it repeats
    history = {0: [rec(0)], 1: [rec(1)]}
    assert crash_loop(history, 1, failed_ranks=2, retries=1) is None


def test_describe_exception_names_type_origin_and_first_line():
    def boom():
        raise ValueError("my bug\nsecond line")

    try:
        boom()
    except ValueError as exc:
        error_type, origin, summary = describe_exception(exc)
    assert error_type == "builtins.ValueError"
    assert origin.endswith("in boom") and "test_crash_loop.py" in origin
    assert summary == "ValueError: my bug"


GLOO_RESET = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:5123: Connection reset by peer")


def collateral(attempt, summary=GLOO_RESET, kind="builtins.RuntimeError"):
    return FailureRecord(rank=0, attempt=attempt, error_type=kind, origin="pair.cc in read",
                         step=3, commits=0, summary=summary)


def test_a_peers_loss_seen_as_a_gloo_or_nccl_error_never_counts_toward_a_loop():
    # the death of rank 1 was not seen by Ray's poll yet: only rank 0's error is reported
    history = {0: [collateral(0)], 1: [collateral(1)]}
    assert crash_loop(history, 1, failed_ranks=1, retries=1) is None
    for summary, kind in (("RuntimeError: NCCL error in: ... ncclRemoteError", "builtins.RuntimeError"),
                          ("DistBackendError: broken", "torch.distributed.DistBackendError")):
        history = {0: [collateral(0, summary, kind)], 1: [collateral(1, summary, kind)]}
        assert crash_loop(history, 1, failed_ranks=1, retries=1) is None
    # the same rule still stops a real repeat
    assert crash_loop({0: [rec(0)], 1: [rec(1)]}, 1, failed_ranks=1, retries=1) == rec(1)


def test_an_attempt_in_which_rayguard_killed_a_worker_is_never_a_loop():
    history = {0: [rec(0)], 1: [rec(1)]}
    assert crash_loop(history, 1, failed_ranks=1, retries=1, deaths={1}) is None
    assert crash_loop(history, 1, failed_ranks=1, retries=1, deaths={0}) == rec(1)


def test_a_ray_train_report_checkpoint_between_failures_is_progress():
    # attempt 0 failed at iteration 2; attempt 1 resumed, reported checkpoints, failed at 4
    history = {0: [rec(0, step=2, commits=1)], 1: [rec(1, step=4, commits=2)]}
    assert crash_loop(history, 1, failed_ranks=1, retries=1) is None
