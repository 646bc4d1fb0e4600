"""The event log of runs and sweeps: one record shape, one kind list, one writer, one reader.

A run writes ``rayguard_events.jsonl`` in its run directory (``Result.path``); a sweep writes
``rayguard_sweep_events.jsonl`` in its experiment directory (:mod:`rayguard.tune.events`,
which adds ``trial_id``). One JSON object a line with at least ``time``, ``kind``, ``rank``,
``node``, ``step``, ``attempt`` and a human ``detail``; other fields sit beside them.
Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON,
readable by ``jq``). Reading is tolerant of unknown kinds and cut lines, for both files,
local or remote. Run kinds: ``start``, ``attempt_started``, ``checkpoint_committed``,
``checkpoint_rejected``, ``stall_detected``, ``nan_detected``, ``worker_died``, ``restart``,
``restored``, ``failed``, ``finished`` (and ``preflight_error``, ``fault_injected``,
``crash_loop``, ``not_retried``, ``preemption_notice``, ``preemption_checkpoint``, and from
:mod:`rayguard.observe` ``steps`` and ``straggler``); sweep kinds are in the same list
(:mod:`~rayguard.events.kinds`). A person should be able to tell what happened from this
file alone.

Parts: :mod:`~rayguard.events.kinds` (the kinds, which are notable),
:mod:`~rayguard.events.record` (the record shape), :mod:`~rayguard.events.files` (where the
logs live), :mod:`~rayguard.events.log` (the writer), :mod:`~rayguard.events.read` and
:mod:`~rayguard.events.lines` (the reader), :mod:`~rayguard.events.fields` (a record's number
fields, as every reader reads them). ``python -m rayguard.events RUN_DIR`` prints a log as
``rayguard events RUN_DIR`` does.
"""

from rayguard.events.files import events_path, sweep_events_path
from rayguard.events.kinds import KINDS, NOTABLE_KINDS, RUN_KINDS, SWEEP_KINDS
from rayguard.events.kinds import check_kind as check_kind
from rayguard.events.lines import EventSource
from rayguard.events.log import EventLog as EventLog
from rayguard.events.log import append_events as append_events
from rayguard.events.read import ParsedLog, follow, iter_events, locate, read, read_log
from rayguard.events.record import BASE_FIELDS as BASE_FIELDS
from rayguard.events.record import json_safe as json_safe
from rayguard.events.record import make_event as make_event

# What users call: read a run's or a sweep's log, locally or remotely, once or following it.
# The writer's parts (EventLog, make_event, json_safe, append_events, check_kind, BASE_FIELDS)
# import from here too, as in 0.1, but are the coordinator's and the sweep log's.
__all__ = ["KINDS", "NOTABLE_KINDS", "RUN_KINDS", "SWEEP_KINDS", "EventSource", "ParsedLog",
           "events_path", "follow", "iter_events", "locate", "read", "read_log",
           "sweep_events_path"]
