"""Every environment variable rayguard reads, with its default, in one place (and the few
fixed names and intervals that driver and workers must agree on).

Names are ``RAYGUARD_*``. ``KNOWN_ENV_VARS`` is the full set (the doctor flags any other
``RAYGUARD_*`` name as a likely misspelling); ``ENV_VARS_TO_PROPAGATE`` are copied from the
driver to the controller and every worker.
"""

from __future__ import annotations

import os

# Fault injection spec, e.g. "kill:rank=1,step=5;hang:rank=0,step=9" (see rayguard.testing).
FAULTS_ENV_VAR = "RAYGUARD_FAULTS"
DEFAULT_FAULTS = ""

# JSON topology file that replaces discovery (simulate any GPU/NUMA layout).
TOPOLOGY_ENV_VAR = "RAYGUARD_TOPOLOGY"
DEFAULT_TOPOLOGY = ""

# Log level of rayguard's own logger.
LOG_LEVEL_ENV_VAR = "RAYGUARD_LOG_LEVEL"
DEFAULT_LOG_LEVEL = "INFO"

# Set to "0" to skip registering the tensor serializers in workers.
SERIALIZERS_ENV_VAR = "RAYGUARD_SERIALIZERS"
DEFAULT_SERIALIZERS = "1"

# CUDA policy of the tensor serializers in processes that never call register:
# "receiver" (land on the receiver's current device) or "cpu".
SERIALIZERS_CUDA_ENV_VAR = "RAYGUARD_SERIALIZERS_CUDA"
DEFAULT_SERIALIZERS_CUDA = "receiver"

# Seconds a worker that received SIGTERM keeps running to take a just-in-time checkpoint
# before the signal is handed on (see rayguard.train.preemption).
PREEMPTION_GRACE_ENV_VAR = "RAYGUARD_PREEMPTION_GRACE_S"
DEFAULT_PREEMPTION_GRACE_S = 25.0

# Ray Train's controller poll interval; rayguard lowers it so that reports do not wait
# for a 2 s poll. A value the user set explicitly is kept.
RAY_TRAIN_POLL_INTERVAL_ENV_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"

# A file holding the checkpoint key (rayguard.checkpoint.auth) for processes given no
# CheckpointConfig(key_file=...): workers, `rayguard checkpoint verify|ls`. Unset: no key.
CHECKPOINT_KEY_FILE_ENV_VAR = "RAYGUARD_CHECKPOINT_KEY_FILE"
DEFAULT_CHECKPOINT_KEY_FILE = ""

NODE_AGENTS_ENV_VAR = "RAYGUARD_NODE_AGENTS"
"""Whether ranks talk to the run's coordinator through one agent per node
(rayguard.run.agent): ``1`` always, ``0`` never; unset: from 256 ranks on."""

LIVE_PG_ENV_VAR = "RAYGUARD_LIVE_PG"
"""Set by the live-recovery backend in every worker (``"<backend>,<timeout_s>"``): how a
replacement and the survivors form their process group again (rayguard.train.live)."""

# Ray's own variable naming the cluster to join. RobustTrainer sets it, for the controller
# (and the actors Ray Train starts from there, its PlacementGroupCleaner among them) and the
# workers, to the cluster fit() runs on: with several clusters on one machine, an unset
# RAY_ADDRESS makes Ray's State API pick the latest `ray start --head`, maybe another one's.
RAY_ADDRESS_ENV_VAR = "RAY_ADDRESS"

# Names of the event logs: a run's, in its run directory, and a sweep's, in its experiment
# directory (paths are built by rayguard.events.files).
EVENTS_FILENAME = "rayguard_events.jsonl"
SWEEP_EVENTS_FILENAME = "rayguard_sweep_events.jsonl"

# The run directory's quarantined nodes (rayguard.health.quarantine_file): written by the
# run, read and edited by `rayguard quarantine list|lift RUN_DIR`.
QUARANTINE_FILENAME = "rayguard_quarantine.json"

# Rank 0 sends its progress (step, metrics) to the run's coordinator at most this often, in
# seconds; the driver's progress line (rayguard.observe.progress) shows what arrived.
SEND_INTERVAL_S = 2.0

KNOWN_ENV_VARS = frozenset(
    {
        FAULTS_ENV_VAR,
        TOPOLOGY_ENV_VAR,
        LOG_LEVEL_ENV_VAR,
        SERIALIZERS_ENV_VAR,
        SERIALIZERS_CUDA_ENV_VAR,
        PREEMPTION_GRACE_ENV_VAR,
        CHECKPOINT_KEY_FILE_ENV_VAR,
        NODE_AGENTS_ENV_VAR,
    }
)

ENV_VARS_TO_PROPAGATE = frozenset({FAULTS_ENV_VAR, TOPOLOGY_ENV_VAR, LOG_LEVEL_ENV_VAR,
                                   SERIALIZERS_ENV_VAR, SERIALIZERS_CUDA_ENV_VAR,
                                   PREEMPTION_GRACE_ENV_VAR, CHECKPOINT_KEY_FILE_ENV_VAR,
                                   NODE_AGENTS_ENV_VAR})


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def propagated_env() -> dict[str, str]:
    """The rayguard variables set in this process that workers must see too."""
    return {k: os.environ[k] for k in ENV_VARS_TO_PROPAGATE if k in os.environ}
