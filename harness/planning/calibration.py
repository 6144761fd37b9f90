"""`cbbench calibrate --from-run`: fit the simulator to any server from bench run folders
(reference_engine/sim/run_fit.py does the fit), check it on other runs, print and save.

A run gives, per successful request: its send time, TTFT, E2E, prompt and output tokens;
run.json's `target.server_settings` (what bench read from the server) gives the batching
settings, which `--server-config KEY=VALUE,...` completes or overrides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.planning.seen_prompts import cached_tokens
from cbbench.harness.planning.send_times import reconstruct
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import HardwareSpec
from cbbench.reference_engine.model.config import resolve_model_config
from cbbench.reference_engine.sim.run_fit import (
    METRICS,
    OVERHEAD_TERMS,
    RUN_TERMS,
    SETTINGS,
    Observed,
    ObservedRun,
    RunFit,
    _errors,
    fit_runs,
    simulate_run,
)
from cbbench.reference_engine.sim.run_fit_terms import RECORDED_ONLY
from rich.console import Console
from rich.table import Table

_INTS = {"max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks", "max_model_len",
         "tensor_parallel_size"}  # fmt: skip


def parse_server_config(text: str | None) -> dict:
    """'max_num_seqs=16,enable_chunked_prefill=true' -> settings (names: run_fit.SETTINGS)."""
    out: dict = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip()
        if not eq or key not in SETTINGS:
            raise CbbenchError(f"--server-config: {part.strip()!r} is not KEY=VALUE with KEY one "
                               f"of {', '.join(SETTINGS)}")  # fmt: skip
        if key in _INTS:
            try:
                out[key] = int(value)
            except ValueError:
                raise CbbenchError(f"--server-config: {key} wants an integer, got {value!r}") from None
        elif value.lower() in ("true", "on", "1", "false", "off", "0"):
            out[key] = value.lower() in ("true", "on", "1")
        else:
            raise CbbenchError(f"--server-config: {key} wants true or false, got {value!r}")
    return out


def observed(path: str, use_itl: bool = True,
             cached: dict[str, int] | None = None) -> tuple[ObservedRun, dict, str | None]:  # fmt: skip
    """A run folder's successful measured requests, its recorded server settings and model;
    `cached`: record id -> prompt tokens the server had cached (seen_prompts.py)."""
    run = load_run(path)
    sends, _ = imported_sends(path, run)
    reqs, preempt = [], 0
    for r in run.records:
        if sends is not None and r.sent_s is None:
            r = replace(r, sent_s=sends[r.id])
        if r.warmup or not r.ok or r.sent_s is None or r.ttft_s is None or r.e2e_s is None:
            continue
        out = r.output_tokens_server or r.output_tokens_client
        prompt = r.prompt_tokens_server or r.prompt_tokens_client or r.prompt_len
        if not out:
            continue
        st = r.extra.get("server_timing") or {}
        server_ttft = None
        if st.get("queue_s") is not None and st.get("prefill_s") is not None:
            server_ttft = st["queue_s"] + st["prefill_s"]
        itl = tuple(r.itl_s) if use_itl and len(r.itl_s) == int(out) - 1 else ()
        hit = min(int((cached or {}).get(r.id, 0)), int(prompt) - 1)
        reqs.append(Observed(r.sent_s, int(prompt), int(out), r.ttft_s, r.e2e_s, server_ttft, itl,
                             max(hit, 0)))  # fmt: skip
        preempt += int(r.extra.get("num_preemptions") or 0)
    if len(reqs) < 4:
        raise CbbenchError(f"{path}: {len(reqs)} streamed successful requests; the fit needs "
                           "at least 4 (streaming: bench without --no-stream)")  # fmt: skip
    t0 = min(r.sent_s for r in reqs)
    reqs = [replace(r, sent_s=r.sent_s - t0) for r in reqs]
    target = run.meta.get("target") or {}
    said = any("num_preemptions" in r.extra for r in run.records)
    root = (target.get("engine") or {}).get("root")
    # the server's /metrics series: preemptions and requests running over the run
    series = [s for s in run.timeseries if s.get("source") == "server"]
    total = [s["preemptions_total"] for s in series if s.get("preemptions_total") is not None]
    if total:
        preempt, said = int(max(total) - min(total)), True
    running = [s["running"] for s in series if s.get("running") is not None]
    return (ObservedRun(run.name, reqs, preempt if said else None,
                        sum(running) / len(running) if running else None),
            _replayed(target.get("server_settings") or {}), root)  # fmt: skip


def _replayed(settings: dict) -> dict:
    """The recorded settings the replay knows (SGLang's schedule_policy and the like stay in
    run.json, out of the fit)."""
    return {k: v for k, v in settings.items() if k in SETTINGS or k in RECORDED_ONLY}


def served_device(path: str) -> str | None:
    """The device a run's server computed on, where its run.json says (the reference
    engine's `target.engine.cbbench.device`); None for a foreign server or an import."""
    try:
        meta = json.loads((Path(path) / "run.json").read_text(encoding="utf-8"))
        return str(meta["target"]["engine"]["cbbench"]["device"]).split(":")[0] or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _source(run) -> str:
    imp = run.meta.get("imported") or {}
    version = f" {imp['version']}" if imp.get("version") else ""
    return f"an import of {imp.get('tool')}{version} ({imp.get('file')})"


def imported_sends(path: str, run) -> tuple[dict[str, float] | None, str | None]:
    """An imported run's send times where its file lacks them and its load determines them
    (send_times.py), by record id, and how they were found; None where the records have
    theirs. One clear error where
    the fit cannot have them: an aggregate-only import, or arrivals drawn at a rate."""
    imp = run.meta.get("imported")
    if not imp:
        return None, None
    if imp.get("aggregate_only") or not run.records:
        raise CbbenchError(
            f"{path}: {_source(run)} holds aggregates only; the fit needs per request the send, "
            "first- and last-token times and token counts (vllm bench serve: --save-result "
            "--save-detailed; AIPerf: profile_export.jsonl; guidellm's benchmarks.json; "
            "inference-perf: per_request_lifecycle_metrics.json)")  # fmt: skip
    ok = [r for r in run.records if r.ok and not r.warmup]
    if not ok or all(r.sent_s is not None for r in ok):
        return None, None
    duration = (run.meta.get("summary") or {}).get("duration_s")
    sent, how = reconstruct(run.records, run.meta.get("load") or {}, duration)
    if sent is None:
        where = (" (start_times: recent vllm bench serve --save-detailed files have them, older "
                 "ones not)" if imp.get("tool") == "vllm-bench" else "")  # fmt: skip
        raise CbbenchError(
            f"{path}: {_source(run)} has no per-request send times{where} and {how}; the fit "
            "will not replay invented arrivals: rerun the tool so that it saves them, or bench "
            "with cbbench")  # fmt: skip
    return {r.id: t for r, t in zip(run.records, sent, strict=True)}, how


def _preset_of(imported: dict[str, tuple[str, str | None]], log) -> str | None:
    """The preset whose public checkpoint an imported file names as its model (vLLM bench's
    model_id is what `--model` was: the HF id, or a local copy of it by that name)."""
    from cbbench.reference_engine.model.config import HF_IDS

    named = {str(m).rstrip("/").lower() for _, m in imported.values() if m}
    for preset, hf in HF_IDS.items():
        if any(n == hf.lower() or n.rsplit("/", 1)[-1] == hf.lower().rsplit("/", 1)[-1]
               for n in named):  # fmt: skip
            log(f"model: the file names {hf}, the checkpoint of the preset {preset}: its shape "
                "is used (--model overrides)")  # fmt: skip
            return preset
    return None


# what the simulated server assumes where a setting is neither recorded nor given
# (run_fit_terms.engine_config: vLLM's defaults)
_ASSUMED = {"max_num_seqs": "256", "max_num_batched_tokens": "2048", "block_size": "16",
            "num_kv_blocks": "unbounded, never the bottleneck,"}  # fmt: skip


def _say_imports(paths: list[str], settings: dict, log) -> dict[str, tuple[str, str | None]]:
    """Log where each imported run's send times came from and the server settings nobody
    gave; returns path -> (its tool, the model name its file records) for the imports."""
    out = {}
    for p in paths:
        run = load_run(p)
        imp = run.meta.get("imported")
        if not imp:
            continue
        out[p] = (str(imp.get("tool")), (run.meta.get("target") or {}).get("model"))
        _, how = imported_sends(p, run)
        if how:
            log(f"{p}: send times not in {imp.get('file')}: {how}")
    missing = [k for k in _ASSUMED if k not in settings]
    if missing:
        why = " (other tools' result files do not record them)" if out else ""
        log("server settings neither recorded nor given" + why + ": "
            + ", ".join(f"{k} ({_ASSUMED[k]} assumed)" for k in missing)
            + "; give the server's: --server-config "
            + ",".join(f"{k}=N" for k in missing))  # fmt: skip
    return out


@dataclass
class RunCalibration:
    runs: list[ObservedRun]
    settings: dict
    model: str
    fit: RunFit
    spec: object  # HardwareSpec
    checks: list[tuple[str, dict, dict]] = field(default_factory=list)  # name, errors, means


def prefix_hits(paths: list[str], served_before: list[str], settings: dict,
                log=None) -> dict[str, dict[str, int]]:  # fmt: skip
    """Per run path: record id -> prompt tokens the server had cached (seen_prompts.py),
    the runs (and the warm-ups `served_before`) taken in the order they started."""
    runs = [load_run(p) for p in [*paths, *served_before]]
    hits = cached_tokens(runs, settings)
    if log:
        n = sum(1 for h in hits[: len(paths)] for v in h.values() if v > 0)
        tok = sum(sum(h.values()) for h in hits[: len(paths)])
        if n:
            log(f"prefix cache: {n} requests of these runs found {tok} prompt tokens cached "
                "(the server's count, or their prompt sent before; only the rest is prefilled)")  # fmt: skip
    return dict(zip(paths, hits, strict=False))


def calibrate_from_runs(paths: list[str], server_config: str | None, model: str | None,
                        dtype: str, name: str | None, holdout: float,
                        check_paths: list[str], served_before: list[str] = (),
                        server_ttft: bool = False, step_jitter: bool = False,
                        log=print) -> RunCalibration:  # fmt: skip
    loaded = [observed(p) for p in paths]
    flags = parse_server_config(server_config)
    recorded = [s for _, s, _ in loaded]
    for p, s in zip(paths[1:], recorded[1:], strict=True):
        differ = sorted(k for k in set(s) & set(recorded[0]) if s[k] != recorded[0][k]
                        and k not in flags)  # fmt: skip
        if differ:
            raise CbbenchError(f"{p}: the server's {', '.join(differ)} differ from "
                               f"{paths[0]}'s: fit runs of one server configuration")  # fmt: skip
    settings = {**recorded[0], **flags}
    imported = _say_imports(paths, settings, log)
    hits = prefix_hits([*paths, *check_paths], list(served_before), settings, log)
    runs = [observed(p, cached=hits.get(p))[0] for p in paths]
    model = model or loaded[0][2] or _preset_of(imported, log)
    if not model:
        named = next(iter(imported.values()), None)
        raise CbbenchError(
            "--from-run: the run does not name its model's architecture"
            + (f" ({named[0]} says only the served name {named[1]!r})" if named else "")
            + "; pass --model (a preset, an HF folder or its config.json)")  # fmt: skip
    try:
        resolve_model_config(model)
    except EngineError as exc:
        raise CbbenchError(f"--model {model}: {exc} (pass --model with the served model's "
                           "preset, HF folder or config.json)") from None  # fmt: skip
    n = sum(len(r.requests) for r in runs)
    log(f"fitting the step model to {n} requests of {len(runs)} run(s); server settings: "
        + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) + f"; holding back the "
        f"last {holdout:.0%} of each run's requests")  # fmt: skip
    fit = fit_runs(runs, model, dtype, settings, holdout, log=log, server_ttft=server_ttft,
                   step_jitter=step_jitter)  # fmt: skip
    spec = hardware_from_fit(fit, name or f"fit-{Path(paths[0]).name}", model, dtype, settings,
                             [str(p) for p in paths], holdout)  # fmt: skip
    if device := served_device(paths[0]):  # what prices a P/D import's copy (kv_import.py)
        spec.fit["device"] = device
    out = RunCalibration(runs, settings, model, fit, spec)
    for p in check_paths:
        run, _, _ = observed(p, cached=hits.get(p))
        pred, _, _ = simulate_run(run, model, dtype, settings, fit.coef, jitter=fit.jitter)
        err = _errors([run], [pred], [[True] * len(run.requests)], None)
        means = {m: (_mean([getattr(r, f"{m}_s") for r in run.requests]),
                     _mean(getattr(pred, f"{m}_s"))) for m in METRICS}  # fmt: skip
        out.checks.append((p, err, means))
    spec.fit["checks"] = [{"run": p, "errors": e} for p, e, _ in out.checks]
    from cbbench.harness.planning.fit_error import measured_error

    spec.fit["measured_error"], spec.fit["measured_on"] = measured_error(
        fit.errors, [(p, e) for p, e, _ in out.checks], [str(p) for p in paths])
    return out



def check_runs(paths: list[str], hardware: str, server_config: str | None, model: str | None,
               dtype: str, console: Console, served_before: list[str] = ()) -> None:  # fmt: skip
    """Predict each run with any hardware (a preset, a calibrate or --from-run JSON) and print
    the error of the means and p99s: how far a spec-sheet preset or an old fit is off."""
    from cbbench.reference_engine.execution.cost_model import get_hardware

    hw = get_hardware(hardware)
    over = {"c_req": (hw.fit or {}).get("request_overhead_s", 0.0),
            "c_req_load": (hw.fit or {}).get("request_overhead_per_in_flight_s", 0.0)}  # fmt: skip
    t = Table(title=f"runs predicted on {hw.name} (relative error of the simulated figure)")
    for col in ("run", *(f"{m.upper()} {s}" for m in METRICS for s in ("mean", "p99"))):
        t.add_column(col, justify="right")
    for p in paths:
        run, recorded, root = observed(p)
        settings = {**recorded, **parse_server_config(server_config)}
        run, _, _ = observed(p, cached=prefix_hits(paths, list(served_before), settings)[p])
        m = model or (hw.fit or {}).get("model") or root
        if not m:
            raise CbbenchError(f"{p}: the run does not name its model; pass --model")
        try:
            pred, _, _ = simulate_run(run, m, dtype, settings, over, hardware=hardware)
        except EngineError as exc:
            raise CbbenchError(f"{p}: {exc}") from None
        err = _errors([run], [pred], [[True] * len(run.requests)], None)
        t.add_row(Path(p).name, *(_pct(err.get(f"{m}_{s}")) for m in METRICS
                                  for s in ("mean", "p99")))  # fmt: skip
    console.print(t)


def _mean(vals) -> float:
    v = [x for x in vals if x is not None]
    return sum(v) / len(v) if v else float("nan")


def print_calibration(c: RunCalibration, console: Console) -> None:
    units = {"c0": "ms per step", "c_tok": "us per batched token", "c_seq": "us per sequence",
             "c_prefill": "ms per prefill chunk", "c_dec_kv": "ns per decode context token",
             "c_pre_ctx": "ns per prefill (query x context) pair",
             "c_req": "ms per request outside the steps (HTTP, network)",
             "c_req_load": "ms more per request in flight at its send"}  # fmt: skip
    scale = {"ms": 1e3, "us": 1e6, "ns": 1e9}
    t = Table(title=f"step model fitted from {len(c.runs)} run(s) ({c.spec.name})")
    for col in ("term", "value", "unit", "identified by these runs"):
        t.add_column(col)
    for term in (*RUN_TERMS, *OVERHEAD_TERMS):
        unit = units[term]
        v = c.fit.coef.get(term, 0.0) * scale[unit[:2]]
        t.add_row(term, f"{v:.4g}", unit, c.fit.identified.get(term, "-"))
    console.print(t)
    e = Table(title="predicted vs measured (relative error of the simulated figure)")
    e.add_column("requests")
    for m in METRICS:
        e.add_column(f"{m.upper()} mean", justify="right")
        e.add_column(f"{m.upper()} p99", justify="right")
    rows = [("fit part", c.fit.errors["fit"]), ("held back", c.fit.errors.get("held_back") or {}),
            ("all", c.fit.errors["all"])]  # fmt: skip
    rows += [(f"check: {Path(p).name}", err) for p, err, _ in c.checks]
    for label, err in rows:
        e.add_row(label, *(_pct(err.get(f"{m}_{s}")) for m in METRICS for s in ("mean", "p99")))
    console.print(e)
    for p, _, means in c.checks:
        console.print(f"  {Path(p).name}: " + ", ".join(
            f"{m.upper()} mean measured {mv * 1e3:.1f} ms, predicted {pv * 1e3:.1f} ms"
            for m, (mv, pv) in means.items()), highlight=False, soft_wrap=True)  # fmt: skip
    for run, pred in zip(c.runs, c.fit.predicted, strict=True):
        if run.running_mean is not None:  # the reconstructed batching against the server's
            console.print(f"  {run.name}: requests running, mean: {run.running_mean:.2f} by the "
                          f"server's /metrics, {pred.running_mean:.2f} simulated; preemptions: "
                          f"{run.num_preemptions}, {pred.num_preemptions} simulated",
                          highlight=False, soft_wrap=True)  # fmt: skip
    for note in c.fit.notes:
        console.print(f"not identified: {note}", highlight=False, soft_wrap=True)


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def save(c: RunCalibration, out: Path, console: Console) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(c.spec.to_dict(), indent=2) + "\n", encoding="utf-8")
    console.print(f"saved {out}: use `cbbench sim --hardware {out} --model {c.model}` or "
                  f"`cbbench plan --hardware {out}`")  # fmt: skip


def hardware_from_fit(fit: RunFit, name: str, model: str, dtype: str, settings: dict,
                      sources: list[str], holdout: float, mem_gb: float = 80.0) -> HardwareSpec:  # fmt: skip
    """The fit as a hardware JSON for `sim` / `plan --hardware`: its coefficients, the
    server settings it was fitted under, and its measured error (held-back requests)."""
    linear = {t: fit.coef.get(t, 0.0) for t in RUN_TERMS}
    measured = fit.errors.get("held_back") or fit.errors.get("all") or {}
    if settings.get("num_kv_blocks"):  # memory sized so the simulated pool is the server's
        from cbbench.reference_engine.execution.cost_model import CostModel

        cost = CostModel(resolve_model_config(model, shape_only=True),
                         HardwareSpec("x", 1.0, 1.0, 1.0), dtype)  # fmt: skip
        pool = settings["num_kv_blocks"] * settings.get("block_size", 16) * cost.kv_bytes_per_token
        mem_gb = (cost.device_weight_bytes + pool) / 1e9 + 1e-6
    return HardwareSpec(
        name, peak_flops=1.0, mem_bw=1.0, mem_gb=mem_gb, flops_efficiency=1.0,
        bw_efficiency=1.0, gpu_memory_utilization=1.0, linear=linear,
        fit={
            "method": "from-run", "model": model, "dtype": dtype, "runs": sources,
            "tensor_parallel_size": int(settings.get("tensor_parallel_size") or 1),
            "server_settings": settings, "holdout": holdout,
            "request_overhead_s": fit.coef.get("c_req", 0.0),
            "request_overhead_per_in_flight_s": fit.coef.get("c_req_load", 0.0),
            "errors": fit.errors, "measured_error": measured,
            "identified": fit.identified, "notes": fit.notes,
            **({"measured_steps": {**fit.measured_steps, "source": "the runs' replay"}}
               if fit.measured_steps else {}),
            **({"step_jitter": fit.jitter} if fit.jitter else {}),
        },
    )  # fmt: skip
