"""What a worker leaves with its run: events, facts, failure records; and the facts and claims
it asks for as they are now.

A mixin of :class:`~rayguard.run.link.RunLink` (:class:`MessageCalls`), kept apart so that
the link's module stays small. Without a node agent every call goes straight to the
coordinator, as it always did. With one (a large run, :mod:`rayguard.run.agent`), what
every rank says or asks at once goes per node: a message (:data:`~rayguard.run.outbox.EVENT`,
:data:`~rayguard.run.outbox.FACT`, :data:`~rayguard.run.outbox.FAILURE`; the memory tier's
:data:`~rayguard.run.outbox.OFFER` is sent by :mod:`rayguard.run.memory_link`) through the
agent's outbox (:class:`AgentDelivery`), a read of a fact and a claim through the agent's
:mod:`~rayguard.run.node_asks`. Nothing is lost when the agent is: a message it did not
take (its call raised, or was not answered within ``ack_s``) goes straight to the
coordinator, which acts on each message id once; a read or a claim whose call to the agent
raised is asked of the coordinator.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from rayguard import runtime
from rayguard.events import make_event
from rayguard.run.outbox import EVENT, FACT, FAILURE, Message, message_id

logger = logging.getLogger("rayguard")

Get = Callable[[Any, float], Any]
"""``get(reference, timeout_s)``: the call's answer, or what it raised (``ray.get``)."""


def _ray_get(ref: Any, timeout_s: float) -> Any:
    import ray

    return ray.get(ref, timeout=timeout_s)


class AgentDelivery:
    """A rank's messages through its node's agent (``via(message)``: the agent's ``deliver``
    call, a reference), else straight to the coordinator (``direct([message])``): from the
    first message the agent did not take (its call raised, or was not answered within
    ``ack_s``) on, for good. A waited message is waited for in the caller; one that is not is
    watched, in order, by a thread of this process, which sends it straight if the agent did
    not take it. A rank's messages so reach the coordinator in the order it sent them, but
    for one sent straight after the agent took it unanswered (the coordinator ignores it: its
    id is known)."""

    def __init__(self, via: Callable[[Message], Any], direct: Callable[[list[Message]], Any],
                 *, ack_s: float, get: Get = _ray_get) -> None:
        self._via = via
        self._direct = direct
        self.ack_s = ack_s
        self._get = get
        self._watched: queue.Queue[tuple[Any, Message]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.lost = False
        """Whether the agent failed this rank: its messages go straight from then on."""

    def send(self, message: Message, wait: bool, timeout_s: float | None = None) -> None:
        """Send ``message``; ``wait``: return once the coordinator has it (raises what the
        straight call raised when the agent did not take it), each call waited up to
        ``timeout_s`` (``None``: ``ack_s``)."""
        if self.lost:
            self._straight(message, wait, timeout_s)
            return
        try:
            ref = self._via(message)
        except Exception as exc:  # the agent's handle is gone
            self._lose(exc)
            self._straight(message, wait, timeout_s)
            return
        if not wait:
            self._watch(ref, message)
            return
        try:
            self._get(ref, self.ack_s if timeout_s is None else timeout_s)
        except Exception as exc:
            self._lose(exc)
            self._straight(message, wait, timeout_s)

    def settle(self, timeout_s: float) -> bool:
        """Whether every watched message was taken or sent straight within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self._watched.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def _lose(self, exc: BaseException) -> None:
        if not self.lost:
            logger.info("rayguard: the node agent did not take a message (%s); this rank sends "
                        "its messages straight to the coordinator from now on",
                        type(exc).__name__)
        self.lost = True

    def _straight(self, message: Message, wait: bool, timeout_s: float | None = None) -> None:
        if not wait:  # behind the watched ones, so that the rank's order holds
            self._watch(None, message)
            return
        self.settle(self.ack_s)
        self._get(self._direct([message]), self.ack_s if timeout_s is None else timeout_s)

    def _watch(self, ref: Any, message: Message) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=runtime.carry(self._run), daemon=True,
                                                name="rayguard-delivery")
                self._thread.start()
        self._watched.put((ref, message))

    def _run(self) -> None:
        while True:
            ref, message = self._watched.get()
            try:
                if ref is not None:
                    self._get(ref, self.ack_s)
                else:
                    self._direct([message])
            except Exception as exc:
                self._lose(exc)
                try:
                    self._direct([message])
                except Exception as err:  # the coordinator is gone too: the run ends
                    logger.warning("rayguard: a %s could not reach the run: %s", message[0],
                                   err)
            finally:
                self._watched.task_done()


class MessageCalls:
    """Events, facts, claims and failure records of a worker's link."""

    ctx: Any
    actor: Any
    agent: Any
    timeouts: Any

    def _init_messages(self) -> None:
        agent, actor = self.agent, self.actor
        self._delivery = None if agent is None else AgentDelivery(
            lambda m: agent.deliver.remote(*m), actor.deliver.remote,
            ack_s=self.timeouts.ack_s)

    def record(self, kind: str, detail: str, *, step: int | None = None, wait: bool = False,
               **extra: Any) -> None:
        """Add an event to the run's log (fire-and-forget unless ``wait``)."""
        ctx = self.ctx
        event = make_event(kind, detail, rank=ctx.rank, node=ctx.node_id, step=step,
                           attempt=ctx.attempt, **extra)
        from rayguard.events.kinds import NOTABLE_KINDS

        logger.log(logging.WARNING if kind in NOTABLE_KINDS else logging.DEBUG,
                   "rayguard event %s rank=%s step=%s: %s", kind, ctx.rank, step, detail)
        self._send_event(event, wait)

    def _send_event(self, event: dict[str, Any], wait: bool) -> None:
        if self._delivery is not None:
            self._delivery.send((EVENT, message_id(), event), wait)
            return
        ref = self.actor.record.remote(event)
        if wait:
            _ray_get(ref, self.timeouts.ack_s)

    def mark(self, key: str, value: Any) -> None:
        """Leave a fact, waited for (the controller reads it after this worker is gone)."""
        try:
            self._leave(key, value, wait=True)
        except Exception as exc:
            logger.debug("rayguard: could not leave %s with the coordinator: %s", key, exc)

    def put(self, key: str, value: Any) -> None:
        """Leave a fact (fire-and-forget)."""
        self._leave(key, value, wait=False)

    def _leave(self, key: str, value: Any, wait: bool) -> None:
        if self._delivery is not None:
            self._delivery.send((FACT, message_id(), (key, value)), wait)
            return
        ref = self.actor.put.remote(key, value)
        if wait:
            _ray_get(ref, self.timeouts.ack_s)

    def get(self, key: str) -> Any:
        """A fact as it is now (``None``: not there)."""
        return self._ask("read", "get", key)

    def claim(self, key: str) -> bool:
        """Whether this rank is the first of the run to ask for ``key``."""
        return bool(self._ask("claim", "claim", key))

    def _ask(self, of_agent: str, of_coordinator: str, key: str) -> Any:
        import ray

        timeout_s = self.timeouts.answer_s
        if self.agent is not None:
            try:
                return ray.get(getattr(self.agent, of_agent).remote(key), timeout=timeout_s)
            except Exception as exc:  # the agent is gone: ask the coordinator
                logger.debug("rayguard: the node agent did not answer %s(%r): %s", of_agent,
                             key, exc)
        return ray.get(getattr(self.actor, of_coordinator).remote(key), timeout=timeout_s)

    def record_failure(self, exc: BaseException, last_step: int) -> None:
        """Tell the coordinator how this attempt ended (the crash-loop rule and the driver's
        final exception read it)."""
        if not isinstance(exc, Exception):
            return
        import traceback

        from rayguard.health.crash_loop import describe_exception

        error_type, origin, summary = describe_exception(exc)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        ctx = self.ctx
        args = (ctx.rank, ctx.attempt, error_type, origin, last_step, summary, text)
        try:
            if self._delivery is not None:
                self._delivery.send((FAILURE, message_id(), args), wait=True)
            else:
                _ray_get(self.actor.record_failure.remote(*args), self.timeouts.ack_s)
        except Exception as err:  # the user's exception matters more than this record
            logger.debug("rayguard: could not record the failure: %s", err)


__all__ = ["AgentDelivery", "MessageCalls"]
