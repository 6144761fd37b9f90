"""The C++ prefill attention against the torch backend's SDPA path, in one process.

    python -m tests.benchmarks.studies.prefill_attention_ab --dtype float32 bfloat16

Per dtype, one torch thread, CPU ms, the backend's switch (`prefill_kernel`) flipped in place
and alternated (`--rounds` pairs): (1) the attention of one layer of `small` (8 heads of 64)
for 8 prompts of 45-120 tokens (560 in all) over a shuffled block pool; (2) one whole
560-token prefill step of those prompts through ModelRunner.execute; (3) with --shapes, one
layer's attention for other shapes (a 2048-token prompt, a 16-token chunk after 1984 cached
tokens, GQA, head_dim 128). CPU time, not wall: on a shared machine wall time measures the
neighbours.
"""

from __future__ import annotations

import argparse
import time

import torch

LENS = [70, 64, 90, 45, 120, 50, 60, 61]  # 560 tokens, the compare-engines prompt sizes
BLOCK = 16


def _cpu_ms(fn, n: int) -> float:
    fn()
    c = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - c) / n * 1e3


def _layer_case(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    heads, dim, pool = 8, 64, 512
    k = torch.randn(pool, BLOCK, heads, dim, generator=gen).to(dtype)
    v = torch.randn(pool, BLOCK, heads, dim, generator=gen).to(dtype)
    perm = torch.randperm(pool, generator=gen).to(torch.int32)
    tables = torch.zeros(len(LENS), 16, dtype=torch.int32)
    used = 0
    for b, n in enumerate(LENS):
        nb = -(-n // BLOCK)
        tables[b, :nb] = perm[used : used + nb]
        used += nb
    starts = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(LENS), heads, dim, generator=gen).to(dtype)
    return q, k, v, tables, torch.tensor(LENS, dtype=torch.int32), starts, dim**-0.5


def _chunks():
    from cbbench.reference_engine.core.executor import ScheduledChunk
    from cbbench.reference_engine.core.outputs import RequestMetrics
    from cbbench.reference_engine.core.sequence import Sequence
    from cbbench.reference_engine.sampling_params import SamplingParams

    out = []
    for i, n in enumerate(LENS):
        prompt = [(7 * i + j) % 500 + 1 for j in range(n)]
        seq = Sequence(str(i), prompt, SamplingParams(temperature=0.0), RequestMetrics(0.0))
        seq.block_table = list(range(i * 9, (i + 1) * 9))
        out.append(ScheduledChunk(seq, n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", action="store_true", help="also the other shapes (fp32)")
    args = ap.parse_args()
    from cbbench.kernels.torch_backend import TorchAttentionBackend
    from cbbench.reference_engine.execution.model_runner import ModelRunner

    torch.set_num_threads(1)
    for name in args.dtype:
        dtype = getattr(torch, name)
        be = TorchAttentionBackend(torch.device("cpu"))
        case = _layer_case(dtype)
        runner = ModelRunner("small", num_kv_blocks=9 * len(LENS), block_size=BLOCK,
                             dtype=name, num_threads=1)  # fmt: skip
        res: dict[str, dict[bool, list[float]]] = {"layer": {False: [], True: []},
                                                   "step": {False: [], True: []}}  # fmt: skip
        for _ in range(args.rounds):
            for flag in (False, True):
                be.prefill_kernel = runner.backend.prefill_kernel = flag
                attn = be.paged_attention
                res["layer"][flag].append(_cpu_ms(lambda a=attn, c=case: a(*c), 20))
                step = runner.execute
                res["step"][flag].append(_cpu_ms(lambda s=step: s(_chunks()), 5))
        for what, label in (("layer", "attention, one layer"), ("step", "prefill step")):
            sdpa = " ".join(f"{x:.1f}" for x in res[what][False])
            cpp = " ".join(f"{x:.1f}" for x in res[what][True])
            print(f"{name}: {label} ({sum(LENS)} tokens), CPU ms: SDPA {sdpa} | C++ {cpp}")
    if args.shapes:
        _shapes()


# (seq_lens, query_lens, KV heads, group, head_dim)
SHAPES = [
    ([2048], [2048], 8, 1, 64),
    ([2000], [16], 8, 1, 64),
    ([1024, 1024], [512, 512], 2, 7, 64),
    ([300] * 4, [300] * 4, 2, 7, 128),
]


def _shapes() -> None:
    from cbbench.kernels.reference import make_paged_case
    from cbbench.kernels.torch_backend import TorchAttentionBackend

    be = TorchAttentionBackend(torch.device("cpu"))
    for lens, qlens, hkv, group, dim in SHAPES:
        c = make_paged_case(lens, qlens, BLOCK, hkv, group, head_dim=dim)
        args = (c["q"], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"],
                c["query_start_loc"], dim**-0.5)  # fmt: skip
        ms = {}
        for flag in (False, True):
            be.prefill_kernel = flag
            ms[flag] = _cpu_ms(lambda a=be.paged_attention, x=args: a(*x), 3)
        print(f"float32: seq_lens {lens}, queries {qlens}, {hkv} KV heads x {group}, head_dim "
              f"{dim}: SDPA {ms[False]:.1f} ms, C++ {ms[True]:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
