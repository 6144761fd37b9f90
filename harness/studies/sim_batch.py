"""The B a simulation's title names: the batch of the schedulers it ran."""

from __future__ import annotations

from collections.abc import Mapping

from cbbench.reference_engine.config.engine_config import EngineConfig


def batch_label(cfgs: Mapping[str, EngineConfig]) -> int | str:
    """One B when every scheduler run holds the same batch, else each one's: `--schedulers
    continuous --max-num-seqs 16` is B=16 (the title said the static default, B=32)."""
    slots = {c.max_batch_slots for c in cfgs.values()}
    if len(slots) == 1:
        return slots.pop()
    return "/".join(f"{c.max_batch_slots} ({name})" for name, c in cfgs.items())
