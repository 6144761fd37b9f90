"""cbbench in Locust's web UI: a `cbbench` tab in Locust's own UI and a standalone page.

- `/cbbench`: server-rendered HTML (refreshes every 2 s): TTFT/TPOT/ITL/E2E percentiles over
  the run's records (`harness/results/summary.py`), request and token throughput, and the server's
  KV usage, running and waiting requests from the telemetry sampler, with sparklines.
- `/cbbench/summary.json`: the same numbers as JSON.
- A "cbbench" tab in Locust's UI (its `extended_tabs` / `extended_tables` hooks), fed through
  `extended_stats` in `/stats/requests`.
"""

from __future__ import annotations

import html
import json
import time

from cbbench.workloads.stats import PERCENTILES
from flask import Blueprint, Response, request

LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))
SERVER_QUEUE = ("server queue", "server_queue_s")
GAUGES = (("KV usage", "kv_usage", 100.0, "%"), ("running", "running", 1.0, ""))
GAUGES += (("waiting", "waiting", 1.0, ""),)
CACHE_S = 1.0
COLUMNS = ("mean", *[f"p{p}" for p in PERCENTILES], "max")


class PageData:
    """Summary of the records so far, recomputed at most once a second."""

    def __init__(self, run) -> None:
        self.run = run
        self._at = 0.0
        self._key: tuple[int, int] = (-1, -1)
        self._summary: dict = {}

    def summary(self) -> dict:
        c = self.run.collector
        key = (len(c.records), c.cancelled)
        if key != self._key or time.monotonic() - self._at > CACHE_S:
            self._summary = c.summary()
            self._key, self._at = key, time.monotonic()
        return self._summary

    def snapshot(self) -> dict:
        c = self.run.collector
        runner = self.run.env.runner
        return {
            "name": c.meta["name"],
            "run_dir": str(c.run_dir),
            "base_url": self.run.settings.base_url,
            "model": self.run.settings.model,
            "state": getattr(runner, "state", None),
            "tests_started": self.run.tests_started,
            "user_count": getattr(runner, "user_count", 0),
            "elapsed_s": self.run.now_s() if self.run.t0_ns is not None else 0.0,
            "summary": self.summary(),
            "telemetry": c.latest_telemetry(),
            "series": [
                {k: p.get(k) for k in ("t_s", "kv_usage", "running", "waiting")}
                for p in c.server_points
            ],
        }

    def tab_rows(self) -> list[dict]:
        """Rows of the cbbench tab in Locust's UI (ms for latencies)."""
        s = self.summary()
        rows = []
        for label, key in (*LATENCIES, SERVER_QUEUE):
            d = s.get(key) or {}
            row = {"metric": f"{label} (ms)", "count": d.get("count", 0)}
            row.update({col: _ms(d.get(col)) for col in COLUMNS})
            rows.append(row)
        sessions = s.get("sessions")
        if sessions:  # multi-turn: first turns against later turns (which resend history)
            for label, key in (
                ("TTFT turn 1", "ttft_turn1_s"),
                ("TTFT later turns", "ttft_later_turns_s"),
            ):
                d = sessions.get(key) or {}
                row = {"metric": f"{label} (ms)", "count": d.get("count", 0)}
                row.update({col: _ms(d.get(col)) for col in COLUMNS})
                rows.append(row)
        for label, key in (
            ("requests/s", "request_throughput"),
            ("output tok/s", "output_throughput"),
        ):
            rows.append({"metric": label, "mean": _num(s.get(key))})
        if sessions:
            hit = sessions.get("prefix_cache_hit_rate_later_turns")
            rows.append({"metric": "prefix-cache hits, later turns (%)", "mean": _num(hit, 100.0)})
        server = self.run.collector.latest_telemetry().get("server", {})
        for label, key, scale, unit in GAUGES:
            v = server.get(key)
            rows.append(
                {"metric": f"{label}{' (' + unit + ')' if unit else ''}", "mean": _num(v, scale)}
            )
        return rows


def _ms(v) -> str:
    return "" if v is None else f"{v * 1000:.1f}"


def _num(v, scale: float = 1.0) -> str:
    return "" if v is None else f"{v * scale:.2f}"


def install(environment, run) -> None:
    """Add the page, the JSON and the tab to `environment.web_ui` (before it starts)."""
    web_ui = environment.web_ui
    data = PageData(run)
    bp = Blueprint("cbbench", __name__)

    @bp.route("/cbbench")
    def page() -> Response:
        return Response(render_page(data.snapshot()), mimetype="text/html")

    @bp.route("/cbbench/summary.json")
    def summary_json() -> Response:
        return Response(json.dumps(data.snapshot(), default=str), mimetype="application/json")

    @web_ui.app.after_request
    def extend_stats(response: Response) -> Response:
        if request.path != "/stats/requests" or response.status_code != 200:
            return response
        body = response.get_json(silent=True)
        if isinstance(body, dict):
            body["extended_stats"] = [{"key": "cbbench", "data": data.tab_rows()}]
            response.set_data(json.dumps(body))
        return response

    web_ui.app.register_blueprint(bp)
    structure = [{"key": "metric", "title": "cbbench"}]
    structure += [{"key": c, "title": c} for c in (*COLUMNS, "count")]
    web_ui.template_args.update(
        extended_tabs=[{"title": "cbbench", "key": "cbbench"}],
        extended_tables=[{"key": "cbbench", "structure": structure}],
        extended_csv_files=[{"href": "/cbbench/summary.json", "title": "cbbench summary (JSON)"}],
    )


def _spark(points: list[tuple[float, float]], width: int = 360, height: int = 60) -> str:
    """Inline SVG polyline of (t, v) points, scaled to the box (empty box if < 2 points)."""
    box = f'<svg width="{width}" height="{height}" class="spark">'
    box += f'<rect width="{width}" height="{height}" fill="#f4f6f8"/>'
    if len(points) < 2:
        return box + "</svg>"
    t0, t1 = points[0][0], points[-1][0]
    vmax = max(max(v for _, v in points), 1e-9)
    xy = " ".join(
        f"{(t - t0) / max(t1 - t0, 1e-9) * (width - 4) + 2:.1f},"
        f"{height - 2 - v / vmax * (height - 4):.1f}"
        for t, v in points
    )
    return box + f'<polyline points="{xy}" fill="none" stroke="#2a7ae2" stroke-width="2"/></svg>'


def _sessions_line(sessions: dict | None) -> str:
    """Multi-turn runs: sessions, TTFT of first against later turns, prefix-cache hits."""
    if not sessions:
        return ""

    def p50(key: str) -> str:
        v = (sessions.get(key) or {}).get("p50")
        return "n/a" if v is None else f"{_ms(v)} ms"

    hit = sessions.get("prefix_cache_hit_rate_later_turns")
    return (
        f"<p>sessions: {sessions['sessions']} ({sessions['sessions_with_failure']} with a "
        f"failed turn), up to {sessions['turns_max']} turns; TTFT p50 turn 1 "
        f"{p50('ttft_turn1_s')}, later turns {p50('ttft_later_turns_s')}; prefix-cache hits "
        f"on later turns {'n/a' if hit is None else f'{hit:.1%}'}</p>"
    )


def render_page(snap: dict) -> str:
    s = snap["summary"]
    esc = html.escape
    counts = s.get("counts", {})
    rows = []
    for label, key in (*LATENCIES, SERVER_QUEUE):
        d = s.get(key) or {}
        cells = "".join(f"<td>{_ms(d.get(c))}</td>" for c in COLUMNS)
        rows.append(f"<tr><th>{label}</th>{cells}<td>{d.get('count', 0)}</td></tr>")
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    server = snap["telemetry"].get("server", {})
    gauges = []
    for label, key, scale, unit in GAUGES:
        pts = [(p["t_s"], p[key]) for p in snap["series"] if p.get(key) is not None]
        v = server.get(key)
        value = "n/a" if v is None else f"{v * scale:.1f}{unit}"
        gauges.append(f"<div class='g'><h3>{label}: {value}</h3>{_spark(pts)}</div>")
    tput = [
        ("requests/s", s.get("request_throughput")),
        ("output tokens/s", s.get("output_throughput")),
        ("total tokens/s", s.get("total_token_throughput")),
    ]
    good = s.get("goodput")
    if good:
        tput.append(("goodput req/s", good.get("requests_per_s")))
    tput_html = "".join(f"<div class='k'><b>{_num(v)}</b><span>{k}</span></div>" for k, v in tput)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>cbbench: {esc(snap["name"])}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #1d2733; background: #fff; }}
table {{ border-collapse: collapse; margin: 12px 0; }}
th, td {{ border: 1px solid #c9d2dc; padding: 4px 10px; text-align: right; }}
thead th {{ background: #2a7ae2; color: #fff; }}
.k {{ display: inline-block; margin: 6px 18px 6px 0; padding: 10px 16px; background: #eef3f9; }}
.k b {{ display: block; font-size: 24px; }} .g {{ display: inline-block; margin-right: 20px; }}
</style></head><body>
<h1>cbbench &mdash; {esc(snap["name"])}</h1>
<p>target {esc(str(snap["base_url"]))} &middot; model {esc(str(snap["model"]))} &middot;
state {esc(str(snap["state"]))} &middot; users {snap["user_count"]} &middot;
{snap["elapsed_s"]:.0f} s &middot; run folder <code>{esc(snap["run_dir"])}</code></p>
<p>requests: {counts.get("completed", 0)} completed, {counts.get("failed", 0)} failed,
{s.get("cancelled_in_flight", 0)} cancelled in flight</p>
{_sessions_line(s.get("sessions"))}
<div>{tput_html}</div>
<h2>Latency (ms)</h2>
<table><thead><tr><th>metric</th>{head}<th>count</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>
<h2>Server</h2>
<div>{"".join(gauges)}</div>
</body></html>
"""
