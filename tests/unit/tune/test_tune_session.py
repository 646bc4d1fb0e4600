"""A fit() inside a Tune trial returns only once the trial has taken the run's last reports
(rayguard/_ray/tune_session.py): Ray's trial moves a report from the run's queue actor into
its own result queue only when Tune asks for the next result, and a training function that
returned first ends the trial ahead of that report (seen: a Transformers trial whose inner run
reached step 20 ended in Tune at step 16). The order of Ray's session (``_TrainSession.get_next``)
is replayed in process, a plain queue in place of the queue actor; no cluster."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

from rayguard._ray.tune_session import SETTLED_POLLS, drain_train_reports, tune_session


class ActorQueue:
    """What the trial's session calls on Ray's queue actor (``ray.util.queue.Queue``)."""

    def __init__(self) -> None:
        self.items: queue.Queue = queue.Queue()
        self.asked = 0

    def put(self, item) -> None:
        self.items.put(item)

    def get(self, block: bool = True, timeout: float | None = None):
        return self.items.get(block=block, timeout=timeout)

    def empty(self) -> bool:
        self.asked += 1
        return self.items.empty()


def trial(reports: ActorQueue) -> SimpleNamespace:
    """A Tune trial's session: its result queue and the run's report queue."""
    return SimpleNamespace(_inter_actor_queue=reports, result_queue=queue.Queue())


def next_result(session: SimpleNamespace, function_returned: threading.Event):
    """Tune asking the trial for its next result, as ``_TrainSession.get_next`` does it:
    the run's reports are moved into the result queue while the function runs; the result
    queue is read in order."""
    while not function_returned.is_set():
        try:
            session.result_queue.put(session._inter_actor_queue.get(timeout=0.02))
        except queue.Empty:
            pass
        try:
            return session.result_queue.get(timeout=0.02)
        except queue.Empty:
            continue
    try:
        session.result_queue.put(session._inter_actor_queue.get(block=False))
    except queue.Empty:
        pass
    return session.result_queue.get(timeout=1)


def run_trial(drain: bool) -> list:
    """The run reports step 16, then step 20 while Tune still handles 16, and its fit()
    returns; Tune asks for the next result only once it has handled the one before."""
    reports = ActorQueue()
    session = trial(reports)
    returned, handled = threading.Event(), threading.Event()

    def training_function() -> None:
        reports.put({"step": 16})
        handled.wait(10)
        reports.put({"step": 20})
        if drain:
            assert drain_train_reports(session, timeout_s=10, poll_s=0.01)
        session.result_queue.put("end")  # the function returned: Tune's end marker
        returned.set()

    worker = threading.Thread(target=training_function)
    worker.start()
    results = [next_result(session, returned)]
    handled.set()
    if drain:
        time.sleep(0.1)  # Tune still handles step 16: the fit() waits meanwhile
    else:
        worker.join()  # Tune handles step 16 slowly: the function has returned meanwhile
    while results[-1] != "end":
        results.append(next_result(session, returned))
    worker.join()
    return results


def test_without_waiting_the_trial_ends_before_the_runs_last_report():
    # Ray's behaviour the wait is for: the end marker is read before step 20
    assert run_trial(drain=False) == [{"step": 16}, "end"]


def test_a_fit_that_waits_lets_the_trial_take_every_report_first():
    assert run_trial(drain=True) == [{"step": 16}, {"step": 20}, "end"]


def test_outside_a_trial_or_without_a_report_queue_there_is_nothing_to_wait_for():
    assert tune_session() is None  # this test process is not a Tune trial
    assert drain_train_reports()
    assert drain_train_reports(SimpleNamespace(_inter_actor_queue=None), timeout_s=0)


def test_a_report_never_taken_ends_the_wait_at_its_bound():
    reports = ActorQueue()
    reports.put({"step": 20})
    started = time.monotonic()
    assert not drain_train_reports(trial(reports), timeout_s=0.2, poll_s=0.01)
    assert time.monotonic() - started < 5


def test_both_queues_must_be_found_empty_several_polls_in_a_row():
    reports = ActorQueue()
    session = trial(reports)
    session.result_queue.put({"step": 20})  # taken from the queue actor, not yet by Tune
    threading.Timer(0.1, session.result_queue.get).start()
    assert drain_train_reports(session, timeout_s=10, poll_s=0.01)
    assert session.result_queue.empty() and reports.asked >= SETTLED_POLLS


def test_a_queue_actor_that_is_gone_ends_the_wait():
    class Gone:
        def empty(self) -> bool:
            raise RuntimeError("ActorDiedError: the queue actor died")

    assert drain_train_reports(SimpleNamespace(_inter_actor_queue=Gone()), timeout_s=10)
