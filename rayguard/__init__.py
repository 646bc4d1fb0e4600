"""rayguard: distributed PyTorch training on Ray that survives the failures that waste GPU-hours.

Public names are re-exported here; everything else lives in modules a user need not open.
"""

from __future__ import annotations

__version__ = "0.1.0"

from rayguard import train
from rayguard.config import GuardConfig
from rayguard.exceptions import ConfigError, RayGuardError
from rayguard.health.config import HealthConfig
from rayguard.trainer import RobustTrainer

__all__ = [
    "ConfigError",
    "GuardConfig",
    "HealthConfig",
    "RayGuardError",
    "RobustTrainer",
    "__version__",
    "train",
]
