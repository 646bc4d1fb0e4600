"""rayguard: distributed PyTorch training on Ray that survives the failures that waste GPU-hours.

Public names are re-exported here; everything else lives in modules a user need not open.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

from rayguard import train
from rayguard.config import CheckpointConfig, GuardConfig
from rayguard.exceptions import ConfigError, RayGuardError
from rayguard.health.config import HealthConfig
from rayguard.health.divergence import DivergenceConfig
from rayguard.health.sweep_config import SweepHealthConfig

if TYPE_CHECKING:
    from rayguard.trainer import RobustTrainer


def __getattr__(name: str) -> Any:
    # Ray Train's torch trainer takes seconds to import; tools that only read checkpoints or
    # run the doctor should not pay for it.
    if name == "RobustTrainer":
        from rayguard.trainer import RobustTrainer

        return RobustTrainer
    if name in ("checkpoint", "doctor", "elastic", "events", "observe", "serialization", "testing",
                "tune"):
        import importlib

        return importlib.import_module(f"rayguard.{name}")
    raise AttributeError(f"module 'rayguard' has no attribute {name!r}")

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "DivergenceConfig",
    "GuardConfig",
    "HealthConfig",
    "RayGuardError",
    "RobustTrainer",
    "SweepHealthConfig",
    "__version__",
    "train",
]
