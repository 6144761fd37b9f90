"""The reference engine end to end on the Triton attention kernels: the GPU check's engine part
(kernels/ stays free of engine imports, so this lives with the engine).

    python -m tests.benchmarks.gpu.engine_check --out results/gpu-check [--quick] [--modes-only]

Runs tests/benchmarks/gpu/kernels_check.py's kernel checks, then `engine_check` on CUDA with --engine-model,
and writes one bench_gpu.json + summary.txt; then graphs_check.py's engine modes (eager vs
decode CUDA graphs, sync vs async scheduling: tok/s, step gap, graph == eager outputs) into
engine_modes.json + engine_modes.txt. `--modes-only` runs just the modes, `--engine-only` the engine check and the modes
(engine.json). Exits 2 without
CUDA or Triton (one line), and 3 when a correctness case fails, the engine does not run on the Triton
kernels, or a modes check fails. `--dry-run [--interpret]`: the CPU path (run_all.py).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from tests.benchmarks.gpu import kernels_check as bench_gpu


def engine_check(
    device: str,
    model: str,
    backend: str = "auto",
    num_requests: int = 16,
    max_tokens: int = 64,
    max_prompt: int = 600,
    token_budget: int = 2048,
) -> dict:
    """The reference engine (continuous batching, fp32, greedy) with `backend`, then with
    "torch": which backend ran, how many attention calls went through it, output tokens/s,
    and how many greedy token streams are identical. Passes when the Triton path ran.
    A `token_budget` below the prompt lengths makes prompts prefill in chunks on top of
    their own cached prefix, mixed with other sequences' decodes."""
    from cbbench.reference_engine.config.engine_config import ContinuousConfig, EngineConfig
    from cbbench.reference_engine.engine.llm_engine import LLMEngine
    from cbbench.reference_engine.sampling_params import SamplingParams

    result: dict = {"model": model, "device": device}
    streams = {}
    for label, name in (("checked", backend), ("torch", "torch")):
        cfg = EngineConfig(
            model=model,
            device=device,
            dtype="float32",
            scheduler="continuous",
            num_kv_blocks=2048,
            max_model_len=1024,
            attention_backend=name,
            continuous=ContinuousConfig(
                max_num_seqs=min(64, token_budget), max_num_batched_tokens=token_budget
            ),
        )
        engine = LLMEngine.from_config(cfg)
        be = engine.executor.backend
        calls = {"n": 0}
        for method in ("paged_attention", "paged_decode_attention"):

            def counted(*a, _real=getattr(be, method), _calls=calls, **kw):
                _calls["n"] += 1
                return _real(*a, **kw)

            setattr(be, method, counted)
        gen = torch.Generator().manual_seed(0)
        vocab = engine.model_config.vocab_size
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        tokens: dict[str, list[int]] = {}
        for i in range(num_requests):
            n = 8 + (37 * i) % max_prompt
            prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
            engine.add_request(f"r{i}", prompt, params)
            tokens[f"r{i}"] = []
        t0, steps = time.perf_counter(), 0
        while engine.has_unfinished_requests() and steps < 5000:
            for out in engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
            steps += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        streams[label] = tokens
        result[label] = {
            "backend": be.name,
            "attention_calls": calls["n"],
            "steps": steps,
            "output_tok_per_s": sum(map(len, tokens.values())) / elapsed,
        }
    same = sum(streams["checked"][r] == streams["torch"][r] for r in tokens)
    result["identical_streams"] = f"{same}/{len(tokens)}"
    result["passed"] = (
        result["checked"]["backend"] == "triton" and result["checked"]["attention_calls"] > 0
    )
    return result


def dry_run(out: Path, interpret: bool) -> int:
    """The CPU path (run_all.py --dry-run): the same code at tiny sizes on the "tiny" model;
    `interpret` (TRITON_INTERPRET=1 set by the caller) runs the Triton kernels' correctness
    grid and the engine on them, else the engine on torch. Writes dry_run.json; 3 when a
    check that must hold on any device fails (correctness, streams, modes)."""
    from tests.benchmarks.gpu.graphs_check import modes_check

    device = torch.device("cpu")
    report: dict = {"interpret": interpret}
    ok = True
    if interpret:
        grid = bench_gpu.correctness_grid(device, [torch.float32], quick=True)
        report["correctness"] = [c.__dict__ for c in grid]
        ok &= all(c.passed for c in grid)
    eng = engine_check("cpu", "tiny", backend="triton" if interpret else "torch",
                       num_requests=3, max_tokens=6, max_prompt=40, token_budget=16)  # fmt: skip
    report["engine"] = eng
    ok &= eng["identical_streams"] == "3/3" and (eng["passed"] or not interpret)
    modes = modes_check("cpu", "tiny", num_requests=3, max_tokens=4, max_num_seqs=4,
                        max_model_len=64, num_kv_blocks=40)  # fmt: skip
    report["modes"] = modes
    ok &= modes["passed"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "dry_run.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"engine_check --dry-run: engine {eng['checked']['backend']} "
          f"{eng['identical_streams']} streams identical to torch; modes "
          f"{'passed' if modes['passed'] else 'FAILED'} -> {'ok' if ok else 'FAIL'}")  # fmt: skip
    return 0 if ok else 3


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = ("--modes-only", "--engine-only", "--dry-run", "--interpret")
    flags = {f: f in argv for f in names}
    argv = [a for a in argv if a not in flags]
    if "--engine-model" not in argv:
        argv += ["--engine-model", "small"]
    args = bench_gpu.parse_args(argv)
    if flags["--dry-run"]:
        return dry_run(args.out, flags["--interpret"])
    rc = 0
    if (flags["--modes-only"] or flags["--engine-only"]) and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device visible to torch; this check needs a GPU "
            "(--dry-run: the CPU path)",
            file=sys.stderr,
        )
        return 2
    if flags["--engine-only"]:  # run_all.py: the kernels ran as their own check
        eng = engine_check("cuda", args.engine_model or "small")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "engine.json").write_text(json.dumps(eng, indent=2, default=str) + "\n")
        print(f"engine on {eng['checked']['backend']}: {eng['identical_streams']} streams "
              f"identical to torch, {eng['checked']['output_tok_per_s']:.0f} tok/s vs torch "
              f"{eng['torch']['output_tok_per_s']:.0f} -> {'ok' if eng['passed'] else 'FAIL'}")  # fmt: skip
        rc = 0 if eng["passed"] else 3
    elif not flags["--modes-only"]:
        report = bench_gpu.kernel_report(args)
        if isinstance(report, int):
            return report
        if args.engine_model:
            report["engine"] = engine_check("cuda", args.engine_model)
        rc = bench_gpu.finish(args.out, report)
    return max(rc, write_modes(args.out, args.engine_model or "small"))


def write_modes(out: Path, model: str) -> int:
    """Eager vs graphs, sync vs async (graphs_check.py) -> engine_modes.json/.txt; 3 on a
    failed check."""
    from tests.benchmarks.gpu.graphs_check import modes_check, summary

    result = modes_check("cuda", model)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_modes.json").write_text(json.dumps(result, indent=2) + "\n")
    text = summary(result)
    (out / "engine_modes.txt").write_text(text)
    print(text, end="")
    return 0 if result["passed"] else 3


if __name__ == "__main__":
    sys.exit(main())
