"""Where the reference engine's CPU time goes in `cbbench compare-engines`, and its ceiling.

    python -m tests.benchmarks.studies.engine_ceiling --dtype float32 bfloat16

For the compare-engines workload (its model folder and workload.json, or the `small` preset
and the built-in workload saved under --out), one torch thread, per dtype:

- the memory floor: CPU ms to read as many bytes as the model's weights once (a decode step
  must stream every weight: the LM head and every projection), on 4 KiB pages and on 2 MiB
  pages (where the host allows; reference_engine/execution/hugepages.py); the engine's own
  buffers follow $CBBENCH_HUGEPAGES (0: ordinary pages) for A/B runs;
- one decode step (ModelRunner.execute) at batch 1 and 8, CPU ms;
- the whole workload run in-process by LLMEngine (all 24 requests added at once, ignore_eos,
  sampled at --temperature: 1.0 by default, the server's default, as compare-engines' requests
  set none): steps, engine CPU-s, tok/CPU-s, the host work the engine process adds per step
  (get_stats + the IPC encode of the step message), CPU ms in all, and the minor page faults
  of the run (glibc handing freed activations back and faulting them in again).

CPU seconds, not wall: on a shared machine wall time measures the neighbours. A memory-bound
step still slows when neighbours use the memory bus; repeat the command and compare.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch
from cbbench.harness.studies.compare_engines import COMPARE_WORKLOAD, model_folder


def _cpu_ms(fn, n: int) -> float:
    fn()
    c = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - c) / n * 1e3


def _decode_ms(folder: Path, dtype: str, batch: int) -> float:
    from cbbench.reference_engine.core.executor import ScheduledChunk
    from cbbench.reference_engine.core.outputs import RequestMetrics
    from cbbench.reference_engine.core.sequence import Sequence
    from cbbench.reference_engine.execution.model_runner import ModelRunner
    from cbbench.reference_engine.sampling_params import SamplingParams

    ctx, block = 128, 16
    per = ctx // block + 1
    runner = ModelRunner(str(folder), num_kv_blocks=batch * per, block_size=block, dtype=dtype)
    chunks = []
    for i in range(batch):
        prompt = [(7 * i + j) % 500 + 1 for j in range(ctx)]
        seq = Sequence(str(i), prompt, SamplingParams(temperature=0.0), RequestMetrics(0.0))
        seq.block_table = list(range(i * per, (i + 1) * per))
        seq.num_computed_tokens = ctx - 1  # the cache is garbage: speed, not values
        chunks.append(ScheduledChunk(seq, 1))
    return _cpu_ms(lambda: runner.execute(chunks), 30)


def _workload(folder: Path, wl, dtype: str, temperature: float = 1.0) -> dict:
    from cbbench.harness.load.prompts import PromptBuilder
    from cbbench.reference_engine.config.engine_config import EngineConfig
    from cbbench.reference_engine.engine.llm_engine import LLMEngine
    from cbbench.reference_engine.sampling_params import SamplingParams
    from cbbench.reference_engine.server.ipc import encode

    pb = PromptBuilder(seed=wl.prompt_seed, prefix_block_size=wl.prefix_block_size)
    reqs = [(pb.token_ids(r.index, r.prompt_len, r.prefix_ids), r.output_len) for r in wl.requests]
    cfg = EngineConfig(model=str(folder), max_model_len=max(len(p) + o for p, o in reqs) + 1,
                       seed=0, dtype=dtype)  # fmt: skip
    cfg.continuous.max_num_seqs = 8
    engine = LLMEngine.from_config(cfg)

    def run(measure: bool) -> dict:
        for i, (prompt, out) in enumerate(reqs):
            sp = SamplingParams(temperature=temperature, max_tokens=out, ignore_eos=True)
            engine.add_request(f"r{i}", prompt, sp)
        steps, step_s, host_s = 0, 0.0, 0.0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        while engine.has_unfinished_requests():
            c0 = time.process_time()
            outputs = engine.step()
            c1 = time.process_time()
            if measure:
                msg = {"t": "step", "now": engine.now(), "outputs": outputs,
                       "stats": engine.get_stats(), "accepted": [], "rejected": []}  # fmt: skip
                encode(msg)
            steps, step_s = steps + 1, step_s + c1 - c0
            host_s += time.process_time() - c1
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return {"steps": steps, "cpu_s": step_s, "host_ms": host_s * 1e3, "faults": faults}

    run(False)  # warm-up: caches, allocator
    return run(True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--out", type=Path, default=Path("results/engine-ceiling"))
    ap.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    args = ap.parse_args()
    import json

    from cbbench.reference_engine.execution import hugepages
    from cbbench.workloads import load_workload

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = args.out / "workload.json"
    spec.write_text(json.dumps(COMPARE_WORKLOAD, indent=2) + "\n", encoding="utf-8")
    wl = load_workload(str(spec), seed=0)
    folder = model_folder(args.model, args.out, 0)
    tokens = sum(r.output_len for r in wl.requests)
    print(f"workload: {len(wl.requests)} requests, {sum(r.prompt_len for r in wl.requests)} "
          f"prompt + {tokens} output tokens, max batch 8, 1 torch thread, temperature "
          f"{args.temperature}")  # fmt: skip
    for dtype in args.dtype:
        weights = torch.empty(_weight_count(folder), dtype=getattr(torch, dtype)).normal_()
        floor = _cpu_ms(lambda w=weights: w.sum(), 10)
        mb = weights.numel() * weights.element_size() / 1e6
        huge, arena = hugepages.zeros(weights.shape, weights.dtype, "floor")
        huge.copy_(weights)
        del weights
        on_huge = (f", {_cpu_ms(lambda w=huge: w.sum(), 10):.1f} ms on 2 MiB pages"
                   if arena.huge_bytes() else f" ({arena.status})")  # fmt: skip
        del huge
        b1, b8 = _decode_ms(folder, dtype, 1), _decode_ms(folder, dtype, 8)
        w = _workload(folder, wl, dtype, args.temperature)
        print(f"{dtype}: read {mb:.0f} MB of weights {floor:.1f} ms CPU{on_huge}; decode step B=1 "
              f"{b1:.1f} ms, B=8 {b8:.1f} ms; workload {w['steps']} steps, {w['cpu_s']:.2f} "
              f"CPU-s = {tokens / w['cpu_s']:.1f} tok/CPU-s ({w['cpu_s'] / w['steps'] * 1e3:.1f}"
              f" ms/step), host work (stats + IPC encode) {w['host_ms']:.0f} ms in all, "
              f"{w['faults']} minor page faults")


def _weight_count(folder: Path) -> int:
    """Weights a decode step streams: every projection and the LM head (embedding rows are
    gathered, not streamed)."""
    import json

    c = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = h * (q + 2 * kv) + q * h + 3 * h * i
    return c["num_hidden_layers"] * layer + v * h


if __name__ == "__main__":
    main()
