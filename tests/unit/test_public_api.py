"""The public surface users code against; changing it must be deliberate."""

import importlib
import pickle
from pathlib import Path

import pytest

import rayguard
from rayguard import GuardConfig, HealthConfig
from rayguard.exceptions import ConfigError

# Every package's __all__: what users import. A change here is a change of the contract.
PUBLIC = {
    "rayguard": [
        "CheckpointConfig", "ConfigError", "DivergenceConfig", "GuardConfig", "HealthConfig",
        "RayGuardError", "RobustTrainer", "SweepHealthConfig", "__version__", "train"],
    "rayguard.train": [
        "ElasticSampler", "GuardContext", "get_context", "heartbeat", "load_state", "report",
        "should_checkpoint"],
    "rayguard.tune": [
        "HealthCallback", "SweepEvent", "SweepHealthConfig", "SweepNotDoneError", "TrialStatus",
        "TuneRun", "Verdict", "read", "run"],
    "rayguard.checkpoint": [
        "RNG_STATE_KEY", "FileRecord", "LoadResult", "Manifest", "Problem", "Rejection",
        "ScanResult", "ShardRecord", "VerifyReport", "capture_rng_state", "find_latest_valid",
        "load", "load_latest_valid", "normalize_state_dict_keys", "read_manifest",
        "restore_rng_state", "save", "scan", "verify"],
    "rayguard.elastic": [
        "ElasticSampler", "RankAssignment", "ReshardError", "WorkerSlot", "check_world_size",
        "grad_accum_steps", "largest_valid_at_most", "plan_ranks", "plan_state_sources",
        "scaled_lr", "valid_world_sizes"],
    "rayguard.health": ["DivergenceConfig", "HealthConfig", "SweepHealthConfig"],
    "rayguard.doctor": [
        "CODES", "DoctorReport", "DoctorUnavailableError", "Finding", "check_node",
        "format_finding", "raise_on_errors", "run", "worker_preflight"],
    "rayguard.placement": [
        "BindingResult", "GpuInfo", "NodePlan", "NumaNode", "Topology", "TopologyError",
        "WorkerPlan", "WorkerRequest", "bind_worker", "discover_topology", "load_topology_file",
        "plan_cluster", "plan_node", "setup_numa", "topology_from_dict"],
    "rayguard.serialization": [
        "SerializerPolicy", "deregister_tensor_serializers", "is_registered",
        "register_tensor_serializers"],
    "rayguard.testing": ["Fault", "FaultInjector", "parse_faults"],
    "rayguard.faults": ["KINDS", "POINTS", "Fault", "FaultInjector", "parse_faults"],
    "rayguard.failures": [
        "AFTER_ONE_REPEAT", "CAUSES", "FATAL_ERRORS", "NOT_RETRIED", "RETRIED", "RETRY_POLICIES",
        "Failure", "classify", "fatal_cause", "most_severe"],
    "rayguard.events": [
        "KINDS", "NOTABLE_KINDS", "RUN_KINDS", "SWEEP_KINDS", "EventSource", "ParsedLog",
        "events_path", "follow", "iter_events", "locate", "read", "read_log",
        "sweep_events_path"],
    "rayguard.run": [],
    "rayguard.controller": [],
    "rayguard.observe": [],
    "rayguard._ray": [],
    "rayguard._torch": [],
}

def _packages() -> list[str]:
    root = Path(rayguard.__file__).parent
    return sorted(".".join(("rayguard", *p.parent.relative_to(root).parts))
                  for p in root.rglob("__init__.py"))


def test_every_package_is_pinned():
    assert sorted(PUBLIC) == _packages()


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_names_are_pinned(package):
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    assert all(getattr(module, name) is not None for name in module.__all__)


def test_every_config_is_reachable_from_rayguard():
    from rayguard.config import CheckpointConfig, GuardConfig
    from rayguard.health.config import HealthConfig
    from rayguard.health.sweep_config import SweepHealthConfig

    for config in (CheckpointConfig, GuardConfig, HealthConfig, SweepHealthConfig):
        assert getattr(rayguard, config.__name__) is config


# The 0.x deprecated aliases were removed: each name is imported from its home (changelog).
REMOVED = {
    "rayguard.checkpoint": ["cleanup_staging", "discard_staging", "staging_dir_for",
                            "read_shard", "shard_rank_for", "write_shard"],
    "rayguard.elastic": ["assignment_from_state", "slot_key", "slots_from_workers"],
    "rayguard.train.session": ["FatalNonFiniteMetricError", "dump_stacks",
                               "watch_optimizer_steps"],
    "rayguard.placement.topology": ["parse_cpulist", "format_cpulist", "discover_gpus_sysfs"],
}


@pytest.mark.parametrize("package, name", [(p, n) for p, names in REMOVED.items()
                                           for n in names])
def test_removed_aliases_are_gone(package, name):
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(package), name)


@pytest.mark.parametrize("module", ["rayguard.fault_spec", "rayguard.progress",
                                    "rayguard.observe.log", "rayguard.testing.faults",
                                    "rayguard._deprecated"])
def test_removed_modules_are_gone(module):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


def test_checkpoint_commit_is_the_module():
    from rayguard import checkpoint
    from rayguard.checkpoint import commit

    assert commit is importlib.import_module("rayguard.checkpoint.commit")
    assert callable(checkpoint.commit.commit)


def test_robust_trainer_is_a_torch_trainer():
    from ray.train.torch import TorchTrainer

    assert issubclass(rayguard.RobustTrainer, TorchTrainer)


@pytest.mark.parametrize("kwargs, needle", [
    ({"seed": -1}, "GuardConfig(seed=-1)"),
    ({"seed": 1.5}, "GuardConfig(seed=1.5)"),
    ({"deterministic": "yes"}, "GuardConfig(deterministic='yes')"),
    ({"health": {"stall_timeout_s": 3}}, "GuardConfig(health="),
    ({"numa": "on"}, "GuardConfig(numa='on')"),
    ({"global_batch_size": 64}, "GuardConfig(micro_batch_size=None)"),
    ({"global_batch_size": 10, "micro_batch_size": 4}, "multiple of micro_batch_size=4"),
    ({"micro_batch_size": 0, "global_batch_size": 8}, "GuardConfig(micro_batch_size=0)"),
    ({"lr_scaling": "cubic"}, "GuardConfig(lr_scaling='cubic')"),
    ({"preflight": 1}, "GuardConfig(preflight=1)"),
    ({"controller_poll_interval_s": 0}, "GuardConfig(controller_poll_interval_s=0)"),
    ({"recovery": "fast"}, "GuardConfig(recovery='fast')"),
    ({"checkpoint": {"mode": "async"}}, "GuardConfig(checkpoint="),
])
def test_guard_config_errors_name_field_value_and_fix(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        GuardConfig(**kwargs)
    assert needle in str(err.value) and "Fix:" in str(err.value)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)


@pytest.mark.parametrize("kwargs, needle", [
    ({"stall_timeout_s": 0}, "HealthConfig(stall_timeout_s=0)"),
    ({"stall_timeout_s": float("inf")}, "HealthConfig(stall_timeout_s=inf)"),
    ({"stall_timeout_multiplier": 0.5}, "stall_timeout_multiplier=0.5"),
    ({"watch_metrics": ("",)}, "watch_metrics"),
    ({"nan_policy": "ignore"}, "nan_policy='ignore'"),
    ({"max_restarts": -1}, "max_restarts=-1"),
    ({"mode": "up"}, "mode='up'"),
    ({"window": 1}, "window=1"),
    ({"divergence_factor": 0.5}, "divergence_factor=0.5"),
    ({"throughput_collapse_fraction": 2.0}, "throughput_collapse_fraction=2.0"),
])
def test_health_config_errors(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        HealthConfig(**kwargs)
    assert needle in str(err.value) and "Fix:" in str(err.value)


def test_health_config_defaults_and_adaptive_timeout():
    h = HealthConfig(watch_metrics=["loss", "val"])
    assert h.watch_metrics == ("loss", "val")
    assert h.stall_timeout_for(None) == h.stall_timeout_floor_s
    assert h.stall_timeout_for(100.0) == 1000.0  # 10 x the slowest step, above the floor
    assert HealthConfig(stall_timeout_s=5).stall_timeout_for(100.0) == 5.0


@pytest.mark.parametrize("kwargs, needle", [
    ({"mode": "background"}, "CheckpointConfig(mode='background')"),
    ({"memory_tier": "yes"}, "CheckpointConfig(memory_tier='yes')"),
    ({"pin_memory": 1}, "CheckpointConfig(pin_memory=1)"),
    ({"memory_peer_copy": "no"}, "CheckpointConfig(memory_peer_copy='no')"),
    ({"finish_timeout_s": 0}, "CheckpointConfig(finish_timeout_s=0)"),
    ({"finish_timeout_s": "1h"}, "CheckpointConfig(finish_timeout_s='1h')"),
    ({"finish_timeout_s": True}, "CheckpointConfig(finish_timeout_s=True)"),
    ({"interval": "yes"}, "CheckpointConfig(interval='yes')"),
    ({"mtbf_s": 0}, "CheckpointConfig(mtbf_s=0)"),
    ({"mtbf_s": "1d"}, "CheckpointConfig(mtbf_s='1d')"),
    ({"mtbf_s": True}, "CheckpointConfig(mtbf_s=True)"),
    ({"min_interval_s": -1}, "CheckpointConfig(min_interval_s=-1): must be a finite number of seconds >= 0"),
    ({"max_interval_s": float("inf")}, "CheckpointConfig(max_interval_s=inf)"),
    ({"max_interval_s": None}, "CheckpointConfig(max_interval_s=None)"),
    ({"min_interval_s": 600, "max_interval_s": 60},
     "CheckpointConfig(min_interval_s=600): must be <= max_interval_s=60"),
])
def test_checkpoint_config_errors(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        rayguard.CheckpointConfig(**kwargs)
    assert needle in str(err.value) and "Fix:" in str(err.value)
