"""`cbbench plan`'s output: the frontier table, the chosen configuration as `cbbench serve`
and vLLM flags, plan.json and a self-contained HTML page with the frontier plot (inline
SVG, no script). Every figure SIMULATED."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.planning import extrapolation
from cbbench.harness.planning.pd import frontiers_by_mode, pd_serve_lines, workers_text
from cbbench.harness.planning.planner import CLOSE, MEETS, MISSES, PlanResult, Point
from cbbench.harness.planning.space import parse_speculative
from cbbench.reference_engine.execution.cost_model import get_hardware
from cbbench.reference_engine.execution.kv_import import describe as describe_import
from cbbench.reference_engine.execution.step_jitter import describe_spec as describe_jitter
from cbbench.reference_engine.model.config import hf_model_id
from cbbench.reference_engine.sim.pd_link import resolve_link
from cbbench.reference_engine.sim.request_overhead import describe as describe_overhead
from cbbench.reference_engine.sim.request_overhead import overhead_of
from rich.console import Console
from rich.table import Table


def _s(v: float) -> str:
    return "inf" if v == float("inf") else f"{v * 1e3:.0f}ms" if v < 1 else f"{v:.2f}s"


def serve_flags(p: Point, model: str) -> str:
    c = p.config
    flags = [f"cbbench serve --model {model} --scheduler {c['scheduler']}"]
    if c["scheduler"] == "continuous":
        flags.append(f"--max-num-seqs {c['max_num_seqs']} "
                     f"--max-num-batched-tokens {c['max_num_batched_tokens']}")  # fmt: skip
        if not c["chunked_prefill"]:
            flags.append("--no-enable-chunked-prefill")
    else:
        flags.append(f"--batch-size {c['max_num_seqs']}")
    if c["kv_cache_dtype"] != "auto":
        flags.append(f"--kv-cache-dtype {c['kv_cache_dtype']}")
    spec = parse_speculative(c.get("speculative", "off"))
    if spec is not None:
        method, draft, k = spec
        flags.append(f"--speculative-method {method} --num-speculative-tokens {k}")
        if draft:
            flags.append(f"--speculative-model {draft}")
    if c.get("tp", 1) > 1:  # the simulator's: the reference engine serves one device
        flags.append(f"--tensor-parallel-size {c['tp']} --executor sim")
    if p.replicas > 1 and p.mode != "disaggregated":  # N engines behind the router
        flags.append(f"--replicas {p.replicas} --router {c['router']}")
    return " ".join(flags)


def vllm_flags(p: Point, model: str) -> str:
    """One vLLM server's flags (a plan of N replicas runs N of them behind a router)."""
    c = p.config
    if c["scheduler"] != "continuous":
        return f"(vLLM batches continuously only: no equivalent of {c['scheduler']} batching)"
    model_id = hf_model_id(model) or f"HF_FOLDER_OF_{model.upper()}"  # no public checkpoint
    flags = [f"vllm serve {model_id} --max-num-seqs {c['max_num_seqs']}",
             f"--max-num-batched-tokens {c['max_num_batched_tokens']}",
             "--enable-chunked-prefill" if c["chunked_prefill"] else "--no-enable-chunked-prefill"]  # fmt: skip
    if c["kv_cache_dtype"] in ("fp8", "int8"):
        flags.append("--kv-cache-dtype fp8")  # vLLM's quantized KV cache
    if c.get("tp", 1) > 1:
        flags.append(f"--tensor-parallel-size {c['tp']}")
    spec = parse_speculative(c.get("speculative", "off"))
    if spec is not None:
        method, draft, k = spec
        conf = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3}
        if draft:
            conf = {"model": hf_model_id(draft) or draft, "num_speculative_tokens": k}
        flags.append(f"--speculative-config '{json.dumps(conf)}'")
    return " ".join(flags)


def _rate(rate: float | None) -> str:
    return "its own arrival times" if rate is None else f"{rate:g} req/s"


def describe_config(p: Point, keys: set[str] | None = None) -> str:
    """'continuous seqs=64 tokens=2048 chunked least-outstanding'; with `keys`, only those
    dimensions (the ones the space varies: the rest are said once, `fixed_dims`)."""
    c = p.config
    show = (lambda k: True) if keys is None else keys.__contains__
    parts = [c["scheduler"]] if show("scheduler") else []
    if show("max_num_seqs"):
        parts.append(f"seqs={c['max_num_seqs']}")
    if c["scheduler"] == "continuous":
        if show("max_num_batched_tokens"):
            parts.append(f"tokens={c['max_num_batched_tokens']}")
        if show("chunked_prefill"):
            parts.append("chunked" if c["chunked_prefill"] else "unchunked")
    if c["kv_cache_dtype"] != "auto" or (keys is not None and show("kv_cache_dtype")):
        parts.append(f"kv={c['kv_cache_dtype']}")
    spec = c.get("speculative", "off")
    if spec != "off" or (keys is not None and show("speculative")):
        parts.append(f"spec={spec}")
    if c.get("tp", 1) > 1 or (keys is not None and show("tp")):
        parts.append(f"tp={c.get('tp', 1)}")
    if p.replicas > 1 and show("router") and p.mode != "disaggregated":
        parts.append(c["router"])
    if p.mode == "disaggregated":
        parts.append(f"P/D {p.prefill}:{p.replicas} over {c['kv_link']}")
    return " ".join(parts) or "-"


def varying_dims(res: PlanResult) -> set[str]:
    """The space's dimensions with more than one value."""
    sp = res.options.space
    dims = {"scheduler": sp.schedulers, "max_num_seqs": sp.max_num_seqs,
            "max_num_batched_tokens": sp.max_num_batched_tokens,
            "chunked_prefill": sp.chunked_prefill, "kv_cache_dtype": sp.kv_cache_dtype,
            "router": sp.routers, "speculative": sp.speculative,
            "tp": sp.tensor_parallel}  # fmt: skip
    return {k for k, v in dims.items() if len(v) > 1}


def fixed_dims(res: PlanResult) -> str:
    """The dimensions every configuration shares, said once: 'continuous, chunked, ...'."""
    sp, vary = res.options.space, varying_dims(res)
    out = []
    if "scheduler" not in vary:
        out.append(sp.schedulers[0])
    if "max_num_seqs" not in vary:
        out.append(f"seqs={sp.max_num_seqs[0]}")
    if "max_num_batched_tokens" not in vary:
        out.append(f"tokens={sp.max_num_batched_tokens[0]}")
    if "chunked_prefill" not in vary:
        out.append("chunked" if sp.chunked_prefill[0] else "unchunked")
    if "kv_cache_dtype" not in vary:
        out.append(f"kv={sp.kv_cache_dtype[0]}")
    if "router" not in vary:
        out.append(f"router {sp.routers[0]}")
    if "speculative" not in vary:
        out.append(f"spec={sp.speculative[0]}")
    return ", ".join(out)


def binding_text(p: Point) -> str:
    b = p.binding
    return f"{b} {_s(p.predicted[b])} [{_s(p.low[b])}, {_s(p.high[b])}]"


def frontier_table(res: PlanResult, points: list[Point] | None = None, mode: str = "") -> Table:
    o = res.options
    what = f"{mode} " if mode else ""
    t = Table(title=f"SIMULATED {what}Pareto frontier, cost vs the binding SLO: {o.workload} "
                    f"at {_rate(o.rate)}, {o.hardware} ({res.model})")  # fmt: skip
    for col in ("replicas", "configuration", "$/hour", "binding SLO [interval]", "top/target",
                "verdict"):  # fmt: skip
        t.add_column(
            col, justify="right" if col in ("replicas", "$/hour", "top/target") else "left"
        )
    vary = varying_dims(res)
    for p in res.frontier if points is None else points:
        mark = " (extrapolated)" if p.extrapolated else ""
        t.add_row(workers_text(p), describe_config(p, vary) + mark, f"{p.cost_per_hour:.2f}",
                  binding_text(p), f"{p.binding_ratio:.2f}", p.verdict)  # fmt: skip
    return t


def print_plan(res: PlanResult, console: Console, out: Path | None) -> None:
    o = res.options
    slos = ", ".join(f"{s.name} <= {_s(s.target_s)}" for s in o.slos)
    band = res.interval_source
    console.print(f"plan: SLO {slos}; {band}; ${o.price_per_replica_hour:g} per GPU-hour; "
                  f"{res.searched} of {res.total} configurations, {len(res.points)} points "
                  "simulated", highlight=False, soft_wrap=True)  # fmt: skip
    if res.dropped:
        console.print(f"--drop-too-long: skipped {res.dropped} requests longer than "
                      f"{res.model}'s max_model_len", highlight=False, soft_wrap=True)  # fmt: skip
    over = describe_overhead(overhead_of(get_hardware(o.hardware)))
    if over:
        console.print(over, highlight=False, soft_wrap=True)
    if jit := describe_jitter(get_hardware(o.hardware)):
        console.print(jit, highlight=False, soft_wrap=True)
    hw = get_hardware(o.hardware)
    links = sorted({p.config["kv_link"] for p in res.points if p.config.get("mode") == "disaggregated"})
    for link in links:  # which link the disaggregated points used and where it came from
        console.print(resolve_link(link, hw).line(overhead_of(hw)), highlight=False, soft_wrap=True)
    if links:
        console.print(describe_import(hw), highlight=False, soft_wrap=True)
    if note := extrapolation.no_range_line(hw):
        console.print(note, highlight=False, soft_wrap=True)
    fixed = fixed_dims(res)
    if fixed:
        console.print(f"every configuration: {fixed}", highlight=False, soft_wrap=True)
    if res.interrupted:
        console.print(f"interrupted: kept the {res.searched} configurations searched so far")
    if res.refused and not res.points and not res.interrupted:
        raise CbbenchError(f"the engine refuses every configuration in the space "
                           f"({len(res.refused)}), e.g. {res.refused[0]}")  # fmt: skip
    if res.refused:
        console.print(f"skipped {len(res.refused)} configurations the engine refuses, e.g. "
                      f"{res.refused[0]}", highlight=False, soft_wrap=True)  # fmt: skip
    by_mode = frontiers_by_mode(res)
    if len(by_mode) > 1:  # aggregated and disaggregated: one frontier each
        for mode, pts in by_mode.items():
            console.print(frontier_table(res, pts, mode))
    else:
        console.print(frontier_table(res))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(res.to_json(), indent=2), encoding="utf-8")
        (out / "plan.html").write_text(html_page(res), encoding="utf-8")
        console.print(f"plan: {out / 'plan.json'}, {out / 'plan.html'}")
    p = res.chosen
    if p is None and res.interrupted:
        console.print("interrupted before any configuration met the SLOs")
        return
    if p is None:
        best = min(res.points, key=lambda x: x.binding_ratio, default=None)
        closest = (f"; the closest, {workers_text(best)} x {describe_config(best)}, predicts "
                   f"{binding_text(best)} ({best.verdict})") if best else ""  # fmt: skip
        raise CbbenchError(
            f"no configuration in the space meets {slos}{closest}: widen the space "
            f"(--space replicas=1-{o.space.max_replicas * 2}, larger max_num_seqs) or relax "
            "the SLO"
        )
    console.print(f"chosen: {workers_text(p)} x {describe_config(p)}, ${p.cost_per_hour:.2f}/hour: "
                  f"{p.verdict} ({'; '.join(f'{k} {v}' for k, v in p.verdicts.items())}); "
                  f"binding {binding_text(p)}", highlight=False, markup=False,
                  soft_wrap=True)  # fmt: skip
    if p.extrapolated:
        console.print(f"EXTRAPOLATED: {extrapolation.describe(p.extrapolated)}: its step times "
                      "there are the fit's model beyond what it measured; calibrate with larger "
                      "steps, or keep the space within the measured range", highlight=False,
                      markup=False, soft_wrap=True)  # fmt: skip
    if p.mode == "disaggregated":
        lines = pd_serve_lines(p, res.model, serve_flags(p, res.model), vllm_flags(p, res.model))
        for line in lines:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
        return
    console.print(f"  {serve_flags(p, res.model)}", highlight=False, soft_wrap=True)
    times = f"  (x{p.replicas}, behind a router)" if p.replicas > 1 else ""
    console.print(f"  {vllm_flags(p, res.model)}{times}", highlight=False, soft_wrap=True)


def _ticks(hi: float) -> list[float]:
    """About five round ticks over [0, hi]."""
    step = 10 ** math.floor(math.log10(hi / 5)) if hi > 0 else 1.0
    for m in (1, 2, 5, 10):
        if hi / (m * step) <= 6:
            step *= m
            break
    return [i * step for i in range(int(hi / step) + 1)]


def frontier_svg(res: PlanResult) -> str:
    """Cost (x) vs the binding SLO's interval top / target (y, log: 1 is the target), every
    point coloured by verdict, the frontier as a line, the chosen point ringed; ticks on
    both axes and a legend."""
    pts = res.points
    w, h, left, right, top, bottom = 860, 420, 70, 170, 20, 50
    finite = [p.binding_ratio for p in pts if 0 < p.binding_ratio < float("inf")] or [1.0]
    xmax = max([p.cost_per_hour for p in pts] or [1.0]) * 1.08
    lo = math.log2(min(min(finite), 0.5)) - 0.2
    hi = math.log2(max(max(finite), 2.0)) + 0.2

    def sx(cost: float) -> float:
        return left + cost / xmax * (w - left - right)

    def sy(ratio: float) -> float:
        r = min(max(ratio, 2**lo), 2**hi) if ratio == ratio else 2**hi
        return top + (hi - math.log2(r)) / (hi - lo) * (h - top - bottom)

    colour = {MEETS: "#1a7f37", CLOSE: "#bf8700", MISSES: "#cf222e"}
    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-size="12">',
             f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="#888"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="#888"/>']  # fmt: skip
    for t in _ticks(xmax):
        x = sx(t)
        parts.append(f'<line x1="{x:.1f}" y1="{h - bottom}" x2="{x:.1f}" y2="{h - bottom + 4}" '
                     f'stroke="#888"/><text x="{x:.1f}" y="{h - bottom + 17}" '
                     f'text-anchor="middle">{t:g}</text>')  # fmt: skip
    for e in range(math.ceil(lo), math.floor(hi) + 1):
        y = sy(2.0**e)
        target = e == 0  # ratio 1: the SLO
        style = 'stroke="#cf222e" stroke-dasharray="4"' if target else 'stroke="#eee"'
        parts.append(
            f'<line x1="{left - 4}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" {style}/>'
            f'<text x="{left - 7}" y="{y + 4:.1f}" text-anchor="end">{2.0**e:g}</text>'
        )
    line = " ".join(f"{sx(p.cost_per_hour):.1f},{sy(p.binding_ratio):.1f}" for p in res.frontier)
    parts.append(f'<polyline points="{line}" fill="none" stroke="#0969da"/>')
    for p in pts:
        tip = html.escape(f"{workers_text(p)} x {describe_config(p)}: {binding_text(p)}, {p.verdict}")
        parts.append(f'<circle cx="{sx(p.cost_per_hour):.1f}" cy="{sy(p.binding_ratio):.1f}" '
                     f'r="4" fill="{colour.get(p.verdict, "#888")}"><title>{tip}</title></circle>')  # fmt: skip
    if res.chosen is not None:
        c = res.chosen
        parts.append(f'<circle cx="{sx(c.cost_per_hour):.1f}" cy="{sy(c.binding_ratio):.1f}" '
                     'r="9" fill="none" stroke="#000" stroke-width="1.5"/>')  # fmt: skip
    legend = [(colour[MEETS], "meets"), (colour[CLOSE], "too close to call"),
              (colour[MISSES], "misses")]  # fmt: skip
    lx = w - right + 20
    for i, (col, text) in enumerate(legend):
        y = top + 14 + 18 * i
        parts.append(f'<circle cx="{lx}" cy="{y - 4}" r="4" fill="{col}"/>'
                     f'<text x="{lx + 10}" y="{y}">{text}</text>')  # fmt: skip
    y = top + 14 + 18 * len(legend)
    parts.append(f'<line x1="{lx - 5}" y1="{y - 4}" x2="{lx + 5}" y2="{y - 4}" stroke="#0969da"/>'
                 f'<text x="{lx + 10}" y="{y}">Pareto frontier</text>'
                 f'<circle cx="{lx}" cy="{y + 14}" r="7" fill="none" stroke="#000"/>'
                 f'<text x="{lx + 10}" y="{y + 18}">chosen</text>'
                 f'<text x="{lx - 5}" y="{y + 40}" fill="#cf222e">- - 1 = the SLO target</text>')  # fmt: skip
    parts.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">'
                 "$ per hour (replicas x price)</text>"
                 f'<text x="16" y="{(top + h - bottom) / 2}" '
                 f'transform="rotate(-90 16 {(top + h - bottom) / 2})" text-anchor="middle">'
                 "binding SLO: interval top / target (log)</text></svg>")  # fmt: skip
    return "".join(parts)


def html_page(res: PlanResult) -> str:
    """One page: the frontier plot (cost vs binding ratio, every point by verdict), the
    frontier table and the chosen configuration's flags."""
    svg = frontier_svg(res)
    rows = "".join(
        f"<tr><td>{workers_text(p)}</td><td>{html.escape(describe_config(p))}"
        f"{' (extrapolated)' if p.extrapolated else ''}</td>"
        f"<td>{p.cost_per_hour:.2f}</td><td>{html.escape(binding_text(p))}</td>"
        f"<td>{p.verdict}</td></tr>"
        for p in res.frontier
    )
    o = res.options
    chosen = "<p>No configuration in the space meets the SLOs.</p>"
    if res.chosen is not None:
        p = res.chosen
        chosen = (f"<h2>Chosen: {workers_text(p)} x {html.escape(describe_config(p))}, "
                  f"${p.cost_per_hour:.2f}/hour ({p.verdict})</h2>"
                  + (f"<p><b>EXTRAPOLATED:</b> {html.escape(extrapolation.describe(p.extrapolated))}"
                     "</p>" if p.extrapolated else "") +
                  f"<pre>{html.escape(serve_flags(p, res.model))}\n"
                  f"{html.escape(vllm_flags(p, res.model))}</pre>")  # fmt: skip
    slos = ", ".join(f"{s.name} &lt;= {_s(s.target_s)}" for s in o.slos)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>cbbench plan</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;"
        "border-bottom:1px solid #ddd}</style></head><body>"
        f"<h1>SIMULATED capacity plan: {html.escape(o.workload)} at {_rate(o.rate)}</h1>"
        f"<p>SLO {slos}; hardware {html.escape(o.hardware)} ({html.escape(res.model)}); "
        f"${o.price_per_replica_hour:g} per GPU-hour; interval: {html.escape(res.interval_source)}; "
        f"{res.searched} of {res.total} configurations searched"
        f"{' (interrupted)' if res.interrupted else ''}.</p>{svg}{chosen}"
        "<h2>Pareto frontier</h2><table><tr><th>replicas</th><th>configuration</th>"
        f"<th>$/hour</th><th>binding SLO</th><th>verdict</th></tr>{rows}</table></body></html>"
    )
