"""`cbbench calibrate`: fit the simulator's step-time model to the real engine, and check it.

Runs the real engine (CPU, in-process) over a few fit workloads, times every engine step,
fits cost_model.STEP_TERMS (reference_engine/sim/calibration.py) and saves a hardware JSON for
`cbbench sim --hardware PATH`. `--validate` then replays held-out workloads
(`--validate-workloads`, default chat: 24 requests, B=8; uniform: 8, B=4; max_model_len
2048, all at once) simulated and real, static and continuous, and prints throughput and p99
E2E side by side with the errors (targets: 5 % / 10 %); `--validate --fit PATH` checks an
existing fit without refitting. `--validate-random K` draws K random workloads (prompt and
output shapes and scales, B, request counts, prefix caching, preemption, chunked admission;
reference_engine/sim/random_draws.py), runs each real (stepped in turn with the fit runs) and
simulated, and prints the error distribution per scheduler, with and without the fit's drift
factors, and whether the fit's prediction interval covers the real figure; every draw is
named SEED:I and reruns alone with `--random-seed SEED --draws I`.

Grid method (the flags of the first calibrate, still supported): --batch-sizes,
--context-lens, --prefill-lens, --repeats, --min-time or a --device other than cpu time
single model-runner steps over a grid of shapes instead (reference_engine/sim/calibration_grid.py);
quicker, and it runs on cuda.

Over 400 lines because one command holds three fits' flags (engine trace, grid, from-run).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cbbench.harness.durations import seconds_arg
from cbbench.reference_engine.config.options import add_engine_args, engine_value
from cbbench.reference_engine.errors import EngineError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the simulator's cost model to measured reference-engine step times",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_args(
        p,
        only=("model", "dtype", "device"),
        defaults={"model": "small", "dtype": "float32", "device": "cpu"},
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="wall: perf_counter (quiet machine); cpu: this thread's CPU time, for a machine "
        "shared with other jobs",
    )
    p.add_argument(
        "--scale", type=float, default=1.0, help="fit workloads' size factor (default 1.0)"
    )
    p.add_argument("--name", default=None, help="hardware name in the JSON")
    p.add_argument(
        "--out",
        default=None,
        help="JSON path (default: calibration-MODEL-cpu.json); the fit's table goes beside it "
        "as X.md (and X-validation.md with --validate)",
    )
    p.add_argument("--validate", action="store_true",
                   help="then compare simulated vs real on the held-out workload")  # fmt: skip
    p.add_argument(
        "--fit",
        default=None,
        metavar="HARDWARE",
        help="with --validate: check this fitted hardware (a calibrate JSON or cpu-measured), "
        "do not refit; with --check-run: any hardware, a preset too",
    )
    p.add_argument(
        "--validate-requests",
        type=int,
        default=None,
        help="requests of the first held-out workload (chat: 24)",
    )
    p.add_argument(
        "--validate-workloads",
        default="chat",
        help="held-out presets, comma-separated (chat: 24 requests, B=8; uniform: 8, B=4)",
    )
    r = p.add_argument_group("random-draw validation")
    r.add_argument("--validate-random", type=int, default=None, metavar="K",
                   help="validate on K workloads drawn at random (see above)")  # fmt: skip
    r.add_argument("--random-seed", type=int, default=0, help="seed of the draws (default 0)")
    r.add_argument("--draws", default=None, metavar="I,J",
                   help="with --validate-random: only these draw indices (rerun a draw)")  # fmt: skip
    r.add_argument("--save-trace", default=None, metavar="PATH",
                   help="also pickle every run's raw steps (shapes, durations) for refits offline")  # fmt: skip
    g = p.add_argument_group("grid method (any of these selects it)")
    g.add_argument("--batch-sizes", default=None, help="decode batch sizes (grid: 1,4,16)")
    g.add_argument(
        "--context-lens", default=None, help="decode context lengths (grid: 32,256,1024)"
    )
    g.add_argument("--prefill-lens", default=None, help="single-prefill lengths (grid: 32,128,512)")
    g.add_argument("--repeats", type=int, default=None, help="min timed runs per grid point (3)")
    g.add_argument(
        "--min-time",
        type=seconds_arg,
        default=None,
        help="keep repeating a grid point up to this many seconds (0.3; 30 runs at most)",
    )
    f = p.add_argument_group("from bench runs (any server: docs/fitting-any-server.md)")
    f.add_argument("--from-run", nargs="+", default=None, metavar="RUN",
                   help="fit the step model to these bench run folders instead of the engine")
    f.add_argument("--server-config", default=None, metavar="KEY=VALUE,...", help="batching "
                   "settings the runs lack: max_num_seqs, max_num_batched_tokens, block_size, ...")
    f.add_argument("--holdout", type=float, default=0.5, help="share of each run's requests "
                   "(the last sent) held back to measure the fit's error (default 0.5)")
    f.add_argument("--server-ttft", action="store_true", help="fit TTFT to the server's own "
                   "(vLLM's per-request metrics); the rest (HTTP, network) measured")
    f.add_argument("--check-run", nargs="+", default=[], metavar="RUN", help="then predict "
                   "these runs and compare (with --fit HW alone: check a preset or fit on them)")
    f.add_argument("--served-before", nargs="+", default=[], metavar="RUN", help="warm-ups "
                   "served earlier, not fitted: their prompts are in the server's cache")
    f.add_argument("--step-jitter", action="store_true", help="also fit the server's step "
                   "jitter (measured / predicted one-step gaps) into the hardware JSON: sim and "
                   "plan then draw each step's time from it, so ITL and TTFT tails carry it; "
                   "each replay is then one sample (means move by a few percent between seeds)")
    f.add_argument("--kv-handoff", nargs="+", default=[], metavar="RUN", help="disaggregated "
                   "bench runs: also fit the KV hand-off from their phase stamps (TTFT less "
                   "prefill queue, prefill, decode queue and this fit's request overhead, on KV "
                   "bytes), printed and saved as fit.kv_link (sim and plan's default P/D link)")
    p.set_defaults(func=run)


def _from_run(args: argparse.Namespace) -> int:
    from cbbench.harness.planning import calibration as rc
    from rich.console import Console

    console, dtype = Console(), args.dtype or "bfloat16"
    if not args.from_run:
        rc.check_runs(args.check_run, args.fit, args.server_config, args.model, dtype, console,
                      args.served_before)  # fmt: skip
        return 0
    for f in args.kv_handoff:  # before the fit (minutes on long runs), not after it
        if not (Path(f) / "requests.jsonl").is_file():
            raise EngineError(f"--kv-handoff {f}: no requests.jsonl (a `cbbench bench --out` "
                              "run folder of a disaggregated server)")  # fmt: skip
    c = rc.calibrate_from_runs(args.from_run, args.server_config, args.model, dtype, args.name,
                               args.holdout, args.check_run, args.served_before, args.server_ttft,
                               step_jitter=args.step_jitter, log=lambda m: console.print(m, highlight=False, soft_wrap=True))  # fmt: skip
    rc.print_calibration(c, console)
    if args.kv_handoff:
        from cbbench.harness.planning.pd_handoff import add_handoff

        console.print(add_handoff(c.spec, args.kv_handoff), highlight=False, soft_wrap=True)
    rc.save(c, Path(args.out or f"calibration-{Path(args.from_run[0]).name}.json"), console)
    return 0


GRID_FLAGS = ("batch_sizes", "context_lens", "prefill_lens", "repeats", "min_time")


def grid_options(args: argparse.Namespace):
    """The grid calibration's Grid when a grid flag or a non-cpu --device asks for it."""
    from cbbench.reference_engine.sim.calibration_grid import Grid, parse_ints

    if all(getattr(args, f) is None for f in GRID_FLAGS) and args.device == "cpu":
        return None
    d = Grid()

    def ints(dest: str):
        text = getattr(args, dest)
        return parse_ints(text, "--" + dest.replace("_", "-")) if text else getattr(d, dest)

    return Grid(
        batch_sizes=ints("batch_sizes"),
        context_lens=ints("context_lens"),
        prefill_lens=ints("prefill_lens"),
        repeats=d.repeats if args.repeats is None else args.repeats,
        min_time_s=d.min_time_s if args.min_time is None else args.min_time,
    )


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.console.progress import request_progress, step_progress
    from cbbench.harness.results.compare import emit_table
    from cbbench.reference_engine.execution.cost_model import get_hardware
    from cbbench.reference_engine.sim import calibration as cal
    from cbbench.reference_engine.sim.validation import held_out
    from rich.console import Console

    if args.step_jitter and not args.from_run:  # it is fitted from the runs' gaps
        raise EngineError("--step-jitter goes with --from-run (the jitter is fitted from the "
                          "runs' gaps between tokens)")  # fmt: skip
    if args.kv_handoff and not args.from_run:  # less the fit's overhead: a fit is made
        raise EngineError("--kv-handoff goes with --from-run (the hand-off is the TTFT less "
                          "the phases and the fitted request overhead)")  # fmt: skip
    if args.from_run or (args.check_run and args.fit):  # --fit: a preset or fit checked on runs
        return _from_run(args)
    if args.server_config or args.check_run or args.server_ttft or args.served_before:
        raise EngineError("--server-config, --server-ttft, --check-run, --served-before go with "
                          "--from-run (--check-run also with --fit HARDWARE)")  # fmt: skip
    for dest in ("model", "dtype", "device"):
        setattr(args, dest, engine_value(args, dest))
    grid = grid_options(args)
    randomly = args.validate_random is not None
    if grid is not None and (args.validate or randomly or args.clock != "wall"
                             or args.scale != 1.0):  # fmt: skip
        raise EngineError(
            "--validate, --validate-random, --clock and --scale go with the engine-trace fit, "
            "not the grid method "
            "(--batch-sizes/--context-lens/--prefill-lens/--repeats/--min-time/--device)"
        )
    if args.scale <= 0:
        raise EngineError(f"--scale must be > 0, got {args.scale}")
    if args.validate_requests is not None and args.validate_requests < 1:
        raise EngineError(f"--validate-requests must be >= 1, got {args.validate_requests}")
    if args.fit and not (args.validate or randomly):
        raise EngineError("--fit only goes with --validate (it checks an existing fit)")
    if args.draws is not None and not randomly:
        raise EngineError("--draws only goes with --validate-random")
    console = Console(soft_wrap=True)
    log = lambda s: console.print(s, highlight=False)  # noqa: E731
    checks = []
    if args.validate:
        names = [w.strip() for w in args.validate_workloads.split(",") if w.strip()]
        checks = held_out(args.model, names, args.clock, args.dtype, args.validate_requests, log)
    drawn = []
    if randomly:
        from cbbench.reference_engine.sim.calibration_grid import parse_ints
        from cbbench.reference_engine.sim.random_draws import DrawCheck, draws

        only = None if args.draws is None else list(parse_ints(args.draws, "--draws", zero=True))
        drawn = [DrawCheck(d, args.model, args.clock, args.dtype, log)
                 for d in draws(args.random_seed, args.validate_random, only)]  # fmt: skip
    with cal.torch_threads(args.threads):
        if args.fit:
            spec = get_hardware(args.fit)
            if spec.linear is None:
                raise EngineError(f"--fit {args.fit}: not a fitted (linear) hardware")
            out = None
        elif grid is not None:
            from cbbench.reference_engine.sim.calibration_grid import calibrate_grid

            console.print(f"calibrating {args.model} on {args.device} ({args.dtype}): grid of "
                          f"{len(grid.points())} runner steps")  # fmt: skip
            n = len(grid.points())
            with step_progress(console, "timing grid points", n, "points") as progress:
                c = calibrate_grid(args.model, args.dtype, args.device, grid, args.name, log,
                                   on_progress=lambda done, _: progress(done))  # fmt: skip
            spec = c.spec
            device = args.device.replace(":", "")
            out = Path(args.out or f"calibration-{Path(args.model).name}-{device}.json")
            emit_table(console, fit_table(c), out.parent, f"{out.stem}.md")
        else:
            console.print(
                f"calibrating {args.model} on cpu ({args.dtype}, {args.threads} thread(s), "
                f"{args.clock} clock)"
                + ("; the held-out runs step in turn with the fit runs" if checks else "")
            )
            with request_progress(console, "fit runs", 1) as progress:
                c = cal.calibrate(args.model, args.dtype, args.clock, args.scale, args.name, log,
                                  validation=checks + drawn, on_progress=progress)  # fmt: skip
            spec = c.spec
            if args.save_trace:
                import pickle

                Path(args.save_trace).parent.mkdir(parents=True, exist_ok=True)
                Path(args.save_trace).write_bytes(pickle.dumps(
                    {"trace": c.trace, "draws": [d.draw for d in drawn], "spec": spec.to_dict()}
                ))  # fmt: skip
            out = Path(args.out or f"calibration-{Path(args.model).name}-cpu.json")
            # Markdown when piped; also beside the JSON (OUT.md)
            emit_table(console, fit_table(c), out.parent, f"{out.stem}.md")
        if checks:
            sizes = ", ".join(
                f"{c.workload} ({len(c.requests)} requests, B={c.batch_size})" for c in checks
            )
            console.print(
                f"validating {spec.name} on held-out workloads: {sizes}, max_model_len "
                f"{cal.VALIDATION['max_model_len']}, all at once, {args.clock} clock"
            )
            rows = [row for c in checks for row in c.compare(spec)]
            folder, name = (None, "") if out is None else (out.parent, f"{out.stem}-validation.md")
            emit_table(console, validation_table(rows, spec.name), folder, name)
            ok = all(r.ok for r in rows)
            console.print(
                f"held-out validation: {'WITHIN' if ok else 'OUTSIDE'} the targets "
                f"(|throughput error| <= {cal.TARGETS['throughput']:.0%}, |p99 E2E error| <= "
                f"{cal.TARGETS['e2e_p99']:.0%})"
            )
            spec.fit["validation"] = {
                "workloads": {
                    c.workload: {"num_requests": len(c.requests), "batch_size": c.batch_size}
                    for c in checks
                },
                "clock": args.clock,
                "rows": [r.to_dict() for r in rows],
            }
        if drawn:
            from cbbench.reference_engine.sim.random_draws import compare_draws, report

            no_drift = None if args.fit else c.no_drift
            console.print(f"validating {spec.name} on {len(drawn)} random draws (seed "
                          f"{args.random_seed}), static and continuous, {args.clock} clock")  # fmt: skip
            results = compare_draws(drawn, spec, no_drift)
            folder, name = (None, "") if out is None else (out.parent, f"{out.stem}-random.md")
            emit_table(console, random_table(results, spec.name), folder, name)
            summary = report(results)
            emit_table(console, random_summary_table(summary), folder,
                       name.replace("-random", "-random-summary"))  # fmt: skip
            spec.fit["random_validation"] = {
                "seed": args.random_seed, "clock": args.clock, "summary": summary,
                "rows": [r.to_dict() for r in results],
            }  # fmt: skip
    if out is not None:
        out.write_text(json.dumps(spec.to_dict(), indent=2) + "\n", encoding="utf-8")
        console.print(
            f"saved {out} (tables: {out.stem}*.md beside it): use `cbbench sim --hardware {out}`"
        )
    return 0


def fit_table(c) -> object:
    from rich.table import Table

    spec = c.spec
    t = Table(title=f"step-time fit ({spec.name}): {spec.fit['points']} measured engine steps")
    for col in ("steps", "count", "measured (ms)", "fitted (ms)", "sum error", "mean |error|"):
        t.add_column(col, justify="right")
    groups = {
        "decode only": [i for i, w in enumerate(c.works) if w.num_prefill_seqs == 0],
        "with a prefill": [i for i, w in enumerate(c.works) if w.num_prefill_seqs > 0],
        "all": list(range(len(c.works))),
    }
    for name, idx in groups.items():
        if not idx:
            continue
        m = sum(c.measured_s[i] for i in idx)
        p = sum(c.predicted_s[i] for i in idx)
        mean = sum(abs(c.predicted_s[i] / c.measured_s[i] - 1) for i in idx) / len(idx)
        # in ms: a tiny model's steps summed to "0.00" in seconds
        t.add_row(name, str(len(idx)), f"{m * 1e3:,.2f}", f"{p * 1e3:,.2f}", f"{p / m - 1:+.1%}",
                  f"{mean:.1%}")  # fmt: skip
    assert spec.linear is not None
    units = {
        "c0": "ms per step",
        "c_host": "ms per step on the host",
        "c_tok": "ms per query token",
        "c_sample": "ms per sampled token",
        "c_seq": "ms per sequence",
        "c_prefill": "ms per prefill chunk",
        "c_dec_ctx": "us per padded decode-context token",
        "c_dec_in_place": "us per decode KV token read in place",
        "c_dec_gathered": "us per decode KV token slot gathered",
        "c_dec_calls": "ms per decode attention call",
        "c_pre_ctx": "us per prefill (query x context) pair",
        "c_mixed": "ms per step mixing prefills and decodes",
    }
    parts = []
    for k, v in spec.linear.items():
        unit = units.get(k, k)
        parts.append(f"{v * (1e6 if unit.startswith('us') else 1e3):.4g} {unit}")
    t.caption = "fit: " + " + ".join(parts) + f"; R^2 {spec.fit['r2']:.4f}"
    return t


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def random_table(results, name: str) -> object:
    from rich.table import Table

    t = Table(title=f"random draws: SIMULATED ({name}) vs MEASURED (real engine), output tok/s "
              "and p99 E2E; interval: the fit's 90 % prediction interval")  # fmt: skip
    for col in ("draw", "workload", "scheduler", "steps", "preempt", "sim tok/s", "real tok/s",
                "error", "no drift factor", "drift divided out", "tok/s interval", "in",
                "p99 E2E error", "p99 interval s", "in"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in results:
        w = r.row
        yes = {True: "yes", False: "NO", None: "-"}
        iv = "-" if r.tok_s_interval is None else "{:.1f}-{:.1f}".format(*r.tok_s_interval)
        pv = "-" if r.p99_interval is None else "{:.2f}-{:.2f}".format(*r.p99_interval)
        t.add_row(
            r.draw.label(), r.draw.describe() if w.scheduler == "static" else "", w.scheduler,
            str(w.num_steps), str(w.num_preemptions), f"{w.sim_throughput:.1f}",
            f"{w.real_throughput:.1f}", _pct(w.throughput_error),
            _pct(r.no_drift.throughput_error if r.no_drift else None), _pct(w.drift_free_error),
            iv, yes[r.covered], _pct(w.e2e_p99_error), pv, yes[r.p99_covered],
        )  # fmt: skip
    return t


def random_summary_table(summary: dict) -> object:
    from rich.table import Table

    t = Table(title="random draws: |error| distribution per scheduler (median / p90 / max)")
    for col in ("scheduler", "output tok/s", "without drift factor", "drift divided out",
                "p99 E2E", "tok/s interval covers", "p99 interval covers"):  # fmt: skip
        t.add_column(col, justify="right")

    def dist(key: str, s: str) -> str:
        d = summary.get(key, {}).get(s)
        if d is None:
            return "-"
        return f"{d['median_abs']:.1%} / {d['p90_abs']:.1%} / {d['max_abs']:.1%}"

    for s, d in summary["throughput"].items():
        n = d["draws"]
        cov = f"{d['covered']} of {n}" if "covered" in d else "-"
        p99 = summary["e2e_p99"][s]
        pcov = f"{p99['covered']} of {n}" if "covered" in p99 else "-"
        t.add_row(s, dist("throughput", s), dist("no_drift", s), dist("drift_free", s),
                  dist("e2e_p99", s), cov, pcov)  # fmt: skip
    return t


def validation_table(rows, name: str) -> object:
    from rich.table import Table

    t = Table(title=f"held-out validation: SIMULATED ({name}) vs MEASURED (real engine)")
    for col in ("workload", "scheduler", "sim tok/s", "real tok/s", "error", "sim p99 E2E s",
                "real p99 E2E s", "error", "step model on the real steps", "within 5%/10%"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r.workload, r.scheduler, f"{r.sim_throughput:.1f}", f"{r.real_throughput:.1f}",
            f"{r.throughput_error:+.1%}", f"{r.sim_e2e_p99:.2f}", f"{r.real_e2e_p99:.2f}",
            f"{r.e2e_p99_error:+.1%}", f"{r.step_model_error:+.1%}", "yes" if r.ok else "NO",
        )  # fmt: skip
    return t
