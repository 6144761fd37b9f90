"""`cbbench probe`: characterise a black-box OpenAI-compatible server with a short designed
workload. Phases (each a run folder under the probe folder, plus `probe.json`):

1. calibrate: a warm-up, then five lone requests -> time per output token and a lone
   request's TTFT (medians; pooled with the concurrency-1 level's when max-batch runs)
2. burst: 16 requests at once -> how many start together
3. batching: a long request plus short ones arriving while it runs -> request- or
   iteration-level batching (and static vs dynamic from how long a lone request waits)
4. max-batch: closed loop at concurrency 1, 2, 4, ... -> where throughput stops growing
5. prefix-cache: a repeated long prompt vs fresh ones -> prefix caching on or off
6. chunked-prefill: long prompts arriving while streams decode -> chunked prefill on or off

Bounded: at most `max_requests` requests and `max_time_s` seconds (a phase that would
overrun either is skipped and says so).

Layer: probe (designed runs of the load layer).
Imports: client, load, results, telemetry, workloads.
"""

from __future__ import annotations

import io
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cbbench.harness.client.api import probe_server
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.probe import design
from cbbench.harness.probe import verdicts as V
from cbbench.harness.probe.verdicts import Verdict
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.redact import redact_meta
from cbbench.harness.telemetry import ServerMetricsSampler, metrics_url_for
from cbbench.workloads.spec import Workload

PROBE_FILE = "probe.json"
PHASES = ("batching", "max-batch", "prefix-cache", "chunked-prefill")


@dataclass
class ProbeConfig:
    base_url: str
    out_dir: Path
    model: str | None = None
    api_key: str | None = None
    max_requests: int = 400
    max_time_s: float = 180.0
    phases: tuple[str, ...] = PHASES
    server_metrics: bool = True
    request_timeout_s: float = 60.0
    log: object = None  # a file for progress lines (default stderr)
    seed: int | None = None  # prompt seed (default: new each probe, so prompts are fresh)


@dataclass
class ProbeResult:
    out_dir: Path
    verdicts: list[Verdict]
    requests: int
    wall_s: float
    skipped: list[str] = field(default_factory=list)


class _Budget:
    def __init__(self, cfg: ProbeConfig) -> None:
        self.cfg = cfg
        self.t0 = time.monotonic()
        self.requests = 0

    def left_s(self) -> float:
        return self.cfg.max_time_s - (time.monotonic() - self.t0)

    def allows(self, n: int, est_s: float = 0.0) -> bool:
        return self.requests + n <= self.cfg.max_requests and est_s < self.left_s()


class Prober:
    def __init__(self, cfg: ProbeConfig) -> None:
        self.cfg = cfg
        self.budget = _Budget(cfg)
        self.log = cfg.log or sys.stderr
        info = probe_server(cfg.base_url, cfg.api_key)
        self.info = info
        self.model = cfg.model or (info["models"][0] if info.get("models") else None)
        if not self.model:
            raise CbbenchError(f"{cfg.base_url}/v1/models lists no model; pass --model")
        self.max_model_len = int(info.get("max_model_len") or 2048)

    def say(self, text: str) -> None:
        print(f"probe: {text}", file=self.log, flush=True)

    def phase(
        self, name: str, wl: Workload, concurrency: int | None = None, warmup: int = 0
    ) -> list[RequestRecord]:
        """The records of one phase; `warmup` copies of its first requests go first, sent
        before t0 and marked warmup (no verdict counts them)."""
        cfg = self.cfg
        self.budget.requests += len(wl) + warmup
        bench = BenchConfig(
            base_url=cfg.base_url,
            workload=wl,
            model=self.model,
            concurrency=concurrency,
            warmup=warmup,
            duration_s=max(1.0, self.budget.left_s()),
            out_dir=cfg.out_dir / name,
            name=f"probe-{name}",
            api_key=cfg.api_key,
            timeout_s=min(cfg.request_timeout_s, max(1.0, self.budget.left_s())),
            live=False,
            command=list(sys.argv),
        )
        samplers = []
        if cfg.server_metrics:
            samplers.append(ServerMetricsSampler(metrics_url_for(cfg.base_url), interval_s=0.1))
        result = run_bench(bench, samplers, console=_quiet())
        if result.interrupted:
            raise KeyboardInterrupt
        return result.records


def _quiet():
    from rich.console import Console

    return Console(file=io.StringIO())


def run_probe(cfg: ProbeConfig) -> ProbeResult:
    out = Path(cfg.out_dir)
    if (out / PROBE_FILE).exists():
        raise CbbenchError(f"{out}: already holds a probe; choose another --out")
    bad = [p for p in cfg.phases if p not in PHASES]
    if bad:
        raise CbbenchError(f"unknown probe phase {bad[0]!r} (known: {', '.join(PHASES)})")
    out.mkdir(parents=True, exist_ok=True)
    pr = Prober(cfg)
    seed = cfg.seed if cfg.seed is not None else int(time.time_ns() % 1_000_000_007)
    design.set_seed(seed)
    verdicts: list[Verdict] = []
    skipped: list[str] = []
    status = "complete"
    pace_info: dict = {}
    try:
        _run_phases(pr, cfg, verdicts, skipped, pace_info)
    except KeyboardInterrupt:  # the phases' run folders keep what finished; so does probe.json
        status = "interrupted"
    result = ProbeResult(
        out, verdicts, pr.budget.requests, time.monotonic() - pr.budget.t0, skipped
    )
    index = {
        "kind": "probe",
        "base_url": cfg.base_url,
        "model": pr.model,
        "server": {k: v for k, v in pr.info.items() if k != "models"},
        "seed": seed,
        "status": status,
        "pace": {**pace_info, "max_model_len": pr.max_model_len},
        "requests": result.requests,
        "wall_s": round(result.wall_s, 2),
        "budget": {"max_requests": cfg.max_requests, "max_time_s": cfg.max_time_s},
        "skipped": skipped,
        "verdicts": [v.to_dict() for v in verdicts],
    }
    text = json.dumps(redact_meta(index), indent=2, default=str)  # no URL password stored
    (out / PROBE_FILE).write_text(text + "\n", encoding="utf-8")
    if status == "interrupted":
        raise KeyboardInterrupt
    return result


def _run_phases(
    pr: Prober, cfg: ProbeConfig, verdicts: list[Verdict], skipped: list[str], pace_info: dict
) -> None:
    """Calibrate, then each selected phase within the budget; appends to `verdicts`."""
    n, warm = design.CALIBRATE, design.CALIBRATE_WARMUP
    pr.say(f"calibrate: {n} lone requests after {warm} warm-up (medians)")
    lone = pr.phase("calibrate", design.calibrate(), concurrency=1, warmup=warm)
    tpot, ttft = V.pace(lone)
    pace = design.Pace(tpot, ttft, pr.max_model_len)
    pace_info.update(tpot_s=tpot, ttft_s=ttft, lone_requests=len(V._ok(lone)))
    pr.say(f"  TPOT {tpot * 1e3:.1f} ms, lone TTFT {ttft * 1e3:.1f} ms")
    burst: list[RequestRecord] = []
    batching_at: tuple[int, list[RequestRecord]] | None = None

    def want(name: str, n: int, est_s: float) -> bool:
        if name not in cfg.phases:
            return False
        if not pr.budget.allows(n, est_s):
            skipped.append(f"{name}: over the budget ({n} requests, ~{est_s:.0f} s)")
            pr.say(f"skip {name}: over the budget")
            return False
        return True

    if want("batching", design.BURST + design.SHORTS + 1, 6 * ttft + 3.0):
        pr.say("batching: a burst, then a long request with short ones arriving")
        burst = pr.phase("burst", design.burst())
        wl, _ = design.batching(pace)
        batching_at = (len(verdicts), pr.phase("batching", wl))  # judged once the pace is final
    if "max-batch" in cfg.phases:
        levels: list[tuple[int, list[RequestRecord]]] = []
        best, flat = 0.0, 0
        for c in design.LADDER:
            wl = design.ladder_level(c)
            est = 2 * (ttft + 16 * tpot * max(1.0, c / 8))
            if not want("max-batch", len(wl), est):
                break
            pr.say(f"max-batch: concurrency {c}")
            recs = pr.phase(f"concurrency-{c}", wl, concurrency=c)
            levels.append((c, recs))
            tput = sum((r.output_tokens_server or 0) for r in recs if r.ok) / max(
                1e-9,
                max((r.end_s or 0) for r in recs) - min((r.sent_s or 0) for r in recs),
            )
            flat = flat + 1 if tput < 1.15 * best else 0
            best = max(best, tput)
            if flat >= 2:
                break
        one = next((recs for c, recs in levels if c == 1), None)
        if one is not None:  # the concurrency-1 level is lone requests too: one pace for both
            lone = lone + one
            tpot, ttft = V.pace(lone)
            pace_info.update(tpot_s=tpot, ttft_s=ttft, lone_requests=len(V._ok(lone)))
            pr.say(f"  batch-1 pace over {len(V._ok(lone))} lone requests (calibration and "
                   f"concurrency 1): TPOT {tpot * 1e3:.1f} ms, lone TTFT {ttft * 1e3:.1f} ms")  # fmt: skip
        if levels:
            verdicts.append(V.max_batch(levels, tpot))
    if batching_at is not None:
        verdicts.insert(batching_at[0], V.batching(batching_at[1], burst, tpot, ttft))
    fresh_ttft = None
    if want("prefix-cache", len(design.PREFIX_PATTERN), 8 * (ttft + 0.5)):
        pr.say(f"prefix-cache: a {pace.long_prompt}-token prompt repeated vs fresh ones")
        recs = pr.phase("prefix-cache", design.prefix_cache(pace), concurrency=1)
        v = V.prefix_caching(recs, design.PREFIX_PATTERN, ttft)
        fresh_ttft = v.numbers.get("ttft_fresh_p50_s")
        verdicts.append(v)
    batching = next((v for v in verdicts if v.name == "batching"), None)
    if "chunked-prefill" not in cfg.phases:
        pass
    elif batching is not None and batching.value in ("static", "dynamic"):
        skipped.append("chunked-prefill: not applicable to request-level batching")
        verdicts.append(
            Verdict(
                "chunked_prefill",
                "n/a",
                "not applicable: request-level batching never mixes prefills into running streams",
                batching.confidence,
            )
        )
    else:
        engine = pr.info.get("cbbench") or {}  # the reference engine says its step budget
        budget = engine.get("max_num_batched_tokens")
        declared = engine.get("enable_chunked_prefill")
        n = design.chunk_prompt(pace, budget)
        if budget and n <= budget and declared is not False:
            verdicts.append(V.prompt_fits_one_step(n, budget, pr.max_model_len))
        elif want("chunked-prefill", 6, 4.5 + 3 * (fresh_ttft or ttft) * n / pace.long_prompt):
            pr.say(f"chunked-prefill: {n}-token prompts arriving while streams decode")
            wl = design.chunked_prefill(pace, prompt_len=n)
            recs = pr.phase("chunked-prefill", wl)
            verdicts.append(V.chunked_prefill(recs, 3, tpot, budget, declared))


__all__ = ["PHASES", "PROBE_FILE", "ProbeConfig", "ProbeResult", "Verdict", "run_probe"]
