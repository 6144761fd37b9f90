"""Round 7's engine changes against what they replaced, in ONE process (separate processes
on this shared 2-core host swing by +-15 %): the compare-engines workload run by LLMEngine at
temperature 1 (as compare-engines' requests), the old piece swapped in place, alternating.

    python -m tests.benchmarks.studies.engine_ab --dtype float32 --variant sampler --pairs 4

--variant sampler: the Sampler's draw through torch ops (divide, softmax, fp64 cumsum,
searchsorted over [rows, vocab]) against the C++ draw (kernels/csrc/cpu_sample.cpp).
--variant mlp (fp32 only): the fused layer's torch silu * up and residual add_ against the
C++ silu_mul and the residual added inside the panels projection.
Prints each run's engine CPU-s (the 272 steps) and the means.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from cbbench.harness.studies.compare_engines import COMPARE_WORKLOAD, model_folder


def _old_draw(self, logits, rows, params, u):
    from cbbench.reference_engine.execution.sampler import inverse_cdf

    return inverse_cdf(self._probs(logits[rows], params), u).tolist()


def _old_fp32(ops, p, x, cos, sin, k_cache, v_cache, meta, backend, decode):
    from cbbench.reference_engine.model import cpu_fused

    h = ops.rms_norm(x, p.norm1, p.eps1)
    qkv = ops.linear(h, p.qkv, p.qkv_bias, p.qkv_out)
    q = ops.rope_and_cache(
        qkv, cos, sin, k_cache, v_cache, meta.slot_mapping, p.num_heads, p.num_kv_heads, p.head_dim
    )
    if decode:
        o = ops.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, p.scale)
    else:
        o = cpu_fused._attention(p.scale, q, k_cache, v_cache, meta, backend)
    x = ops.linear(o.view(x.shape[0], p.q_size), p.o, None, p.o_out).add_(x)
    h = ops.rms_norm(x, p.norm2, p.eps2)
    gate_up = ops.linear(h, p.gate_up, None, p.gate_up_out)
    a = F.silu(gate_up[:, : p.inter]).mul_(gate_up[:, p.inter :])
    return ops.linear(a, p.down, None, p.down_out).add_(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--variant", choices=("sampler", "mlp"), default="sampler")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("results/engine-ab"))
    args = ap.parse_args()
    from cbbench.harness.load.prompts import PromptBuilder
    from cbbench.reference_engine.config.engine_config import EngineConfig
    from cbbench.reference_engine.engine.llm_engine import LLMEngine
    from cbbench.reference_engine.execution.sampler import Sampler
    from cbbench.reference_engine.model import cpu_fused
    from cbbench.reference_engine.sampling_params import SamplingParams
    from cbbench.workloads import load_workload

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = args.out / "workload.json"
    spec.write_text(json.dumps(COMPARE_WORKLOAD), encoding="utf-8")
    wl = load_workload(str(spec), seed=0)
    pb = PromptBuilder(seed=wl.prompt_seed, prefix_block_size=wl.prefix_block_size)
    reqs = [(pb.token_ids(r.index, r.prompt_len, r.prefix_ids), r.output_len) for r in wl.requests]
    cfg = EngineConfig(model=str(model_folder("small", args.out, 0)), seed=0, dtype=args.dtype,
                       max_model_len=max(len(p) + o for p, o in reqs) + 1)  # fmt: skip
    cfg.continuous.max_num_seqs = 8
    engine = LLMEngine.from_config(cfg)
    if args.variant == "sampler":
        owner, name, old = Sampler, "_draw", _old_draw
    else:
        assert args.dtype == "float32", "--variant mlp swaps the fp32 fused layer"
        owner, name, old = cpu_fused, "_fp32", _old_fp32
    new = getattr(owner, name)
    runs = 0

    def run() -> float:
        nonlocal runs
        runs += 1
        for i, (prompt, out) in enumerate(reqs):
            sp = SamplingParams(temperature=1.0, max_tokens=out, ignore_eos=True)
            engine.add_request(f"r{runs}-{i}", prompt, sp)
        c = time.process_time()
        while engine.has_unfinished_requests():
            engine.step()
        return time.process_time() - c

    res: dict[str, list[float]] = {"old": [], "new": []}
    for fn in (old, new):  # a warm-up run of each
        setattr(owner, name, fn)
        run()
    for i in range(args.pairs):
        order = (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old))
        for label, fn in order:
            setattr(owner, name, fn)
            res[label].append(round(run(), 3))
    setattr(owner, name, new)
    means = {k: sum(v) / len(v) for k, v in res.items()}
    print(f"{args.dtype} {args.variant}: old {res['old']} new {res['new']} CPU-s; mean "
          f"{means['old']:.3f} -> {means['new']:.3f} ({means['new'] / means['old'] - 1:+.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
