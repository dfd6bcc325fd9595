"""The scheduling policy: who computes which tokens each step."""

from __future__ import annotations

from actors.core.scheduler.config import SchedulerConfig, SchedulerStats
from actors.core.scheduler.policy import Scheduler

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerStats"]
