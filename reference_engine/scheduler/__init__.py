"""Batching policies behind one interface; `make_scheduler` picks one by name.

Layer: scheduler (the batching policies).
Imports: config, core.
"""

from __future__ import annotations

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.core.block_manager import BlockManager
from cbbench.reference_engine.scheduler.base import Scheduler, SchedulerOutput
from cbbench.reference_engine.scheduler.continuous import ContinuousScheduler
from cbbench.reference_engine.scheduler.dynamic import DynamicScheduler
from cbbench.reference_engine.scheduler.static import StaticScheduler

SCHEDULER_CLASSES: dict[str, type[Scheduler]] = {
    "static": StaticScheduler,
    "dynamic": DynamicScheduler,
    "continuous": ContinuousScheduler,
}


def make_scheduler(
    config: EngineConfig, block_manager: BlockManager, max_model_len: int
) -> Scheduler:
    return SCHEDULER_CLASSES[config.scheduler](config, block_manager, max_model_len)


__all__ = ["Scheduler", "SchedulerOutput", "make_scheduler", "SCHEDULER_CLASSES"]
