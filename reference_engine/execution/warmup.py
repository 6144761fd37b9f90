"""Warm-up at start: dummy steps through the real kernels before the first request.

Triton compiles each kernel on its first call (seconds per kernel on a GPU; the disk cache
only saves the compile, not the load), so without this the first request's TTFT would hold
the compiles, as vLLM avoids with its dummy runs at start. On CUDA the engine runs, through
the ModelRunner: a prefill chunk from scratch, a chunk over that cached prefix (the chunked
prefill path), and a decode step; decode graphs were captured before, which runs each
bucket's decode once.

The warm-up's sequence lives in a private BlockManager (the engine's pool, prefix cache and
stats never see it), its blocks are zeroed after, greedy sampling draws no random numbers,
and a MoE model's expert-load counters are restored: the engine starts exactly as empty.
On the CPU it is skipped (nothing is compiled at the first call: the C++ kernels are built
when the ModelRunner is made).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cbbench.reference_engine.core.block_manager import BlockManager
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class WarmupReport:
    seconds: float
    steps: list[str]  # "prefill 17 over 0", "prefill 18 over 17", "decode 1"


def should_warm_up(runner) -> bool:
    """On CUDA: the first call of each Triton kernel compiles it."""
    device = getattr(runner, "device", None)  # the simulator's executor has none
    return device is not None and device.type == "cuda"


def warm_up(runner, max_model_len: int) -> WarmupReport | None:
    """Run the dummy steps on `runner` (a ModelRunner); see the module docstring. None (no
    warm-up) where a 3-token sequence cannot fit."""
    import torch

    bs = runner.block_size
    n = min(2 * bs + 3, max_model_len - 1, runner.num_kv_blocks * bs - 1)  # + 1 decoded
    if n < 2:
        return None
    first = min(n - 1, bs + 1)  # then the rest over its cached prefix (crosses a block edge)
    bm = BlockManager(runner.num_kv_blocks, bs, False)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    seq = Sequence("warmup", [1 + i % 97 for i in range(n)], params, RequestMetrics(0.0))
    moe = list(getattr(runner.model, "moe_blocks", list)())
    loads = [b.expert_load.clone() for b in moe]
    steps: list[str] = []
    t0 = time.perf_counter()
    for k in (first, n - first, 1):  # two prefill chunks, then one decode
        done = seq.num_computed_tokens
        assert bm.allocate_slots(seq, done + k)
        out = runner.execute([ScheduledChunk(seq, k)])
        steps.append("decode 1" if done >= n else f"prefill {k} over {done}")
        seq.num_computed_tokens += k
        if seq.num_computed_tokens == seq.num_tokens:  # the chunk reached the last token
            seq.token_ids.append(out[0][0])
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    seconds = time.perf_counter() - t0
    idx = torch.tensor(seq.block_table, dtype=torch.long, device=runner.kv_cache.device)
    runner.kv_cache.view(torch.uint8).index_fill_(2, idx, 0)  # bytes: any storage dtype
    with torch.no_grad():
        for b, load in zip(moe, loads, strict=True):
            b.expert_load.copy_(load)
    runner.last_logprobs = {}
    return WarmupReport(round(seconds, 3), steps)
