"""Where a served compare-engines run's wall time goes: the reference server as compare-engines
starts it, per process and per engine thread.

    python -m tests.benchmarks.studies.served_profile --dtype bfloat16 --repeats 2 [--bind]

For each repeat (same server): the measured phase's tok/s (compare-engines' figure), the CPU
seconds of the API process, the engine process and this load generator, and for each engine
thread its run time, its run-queue wait (runnable, not running: other processes had the
cores) and its time slices, from /proc/<pid>/task/*/schedstat (Linux). Wall time minus the
engine thread's run time minus its wait is time it slept (waiting for requests or IPC).
`--bind`: the engine bound to core 0, as compare-engines does with --threads 1.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _cpu_s(pid: int) -> float:
    from cbbench.harness.studies.engine_placement import _stat

    f = _stat(pid)
    return 0.0 if f is None else (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[str, tuple[float, float, int]]:
    """thread id:name -> (run s, run-queue wait s, time slices)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run, wait, slices = (task / "schedstat").read_text().split()[:3]
            out[f"{task.name}:{(task / 'comm').read_text().strip()}"] = (
                int(run) / 1e9, int(wait) / 1e9, int(slices))
        except OSError:
            continue
    return out


def main() -> None:
    from cbbench.harness.load.runner import BenchConfig, run_bench
    from cbbench.harness.servers.launcher import launch_reference_server
    from cbbench.harness.studies import compare_engines as ce
    from cbbench.harness.studies import engine_placement as ep
    from cbbench.reference_engine.config.options import engine_argv
    from cbbench.workloads import load_workload
    from rich.console import Console

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--bind", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("results/served-profile"))
    args = ap.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "workload.json"
    spec.write_text(json.dumps(ce.COMPARE_WORKLOAD), encoding="utf-8")
    wl = load_workload(str(spec), seed=0)
    folder = ce.model_folder("small", out, 0)
    max_len = max(r.prompt_len + r.output_len for r in wl.requests) + 1
    flags = engine_argv({"max_num_seqs": 8, "max_model_len": max_len, "seed": 0,
                         "dtype": args.dtype, "max_num_batched_tokens": ce.step_budget()})
    with ce.torch_threads(1), launch_reference_server(str(folder), "continuous", "cpu",
                                                      flags) as server:  # fmt: skip
        api = server.process.pid
        engine = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()
                  and (f := ep._stat(int(e.name))) is not None and int(f[1]) == api]
        assert engine, "the server has no engine process"
        if args.bind:
            ep.bind_engine(api, {0})
        for rep in range(args.repeats):
            api0, eng0, th0 = _cpu_s(api), sum(map(_cpu_s, engine)), _threads(engine[-1])
            me0, w0 = time.process_time(), time.perf_counter()
            cfg = BenchConfig(base_url=server.base_url, workload=wl, concurrency=8, warmup=1,
                              out_dir=out / f"rep{rep}", name="reference", command=[], live=False)
            s = run_bench(cfg, [], Console(stderr=True, quiet=True)).summary
            wall = time.perf_counter() - w0
            threads = {k: [round(v[0] - th0.get(k, (0, 0, 0))[0], 2),
                           round(v[1] - th0.get(k, (0, 0, 0))[1], 2), v[2] - th0.get(k, (0, 0, 0))[2]]
                       for k, v in _threads(engine[-1]).items()}  # fmt: skip
            print(json.dumps({
                "repeat": rep, "dtype": args.dtype, "bound": args.bind,
                "tok_s": round(s["total_output_tokens"] / s["duration_s"], 1),
                "measured_s": round(s["duration_s"], 2), "wall_with_warmup_s": round(wall, 2),
                "cpu_s": {"api": round(_cpu_s(api) - api0, 2),
                          "engine": round(sum(map(_cpu_s, engine)) - eng0, 2),
                          "load_generator": round(time.process_time() - me0, 2)},
                "engine_threads_run_wait_slices": threads,
                "load_average": [round(x, 1) for x in os.getloadavg()],
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
