"""Health of a run: the progress watchdog, the NaN guard, decisions and their executor."""

from rayguard.health.config import HealthConfig

__all__ = ["HealthConfig"]
