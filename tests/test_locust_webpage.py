"""The cbbench page's HTML from a snapshot: escaping, an empty run, numbers where they belong."""

from types import SimpleNamespace

from cbbench.harness.locust.collector import RunCollector
from cbbench.harness.locust.settings import LocustSettings
from cbbench.harness.locust.webpage import PageData, _spark, render_page
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import summarize
from cbbench.workloads import load_workload


def _snap(records, name="run", series=(), server=None) -> dict:
    return {
        "name": name,
        "run_dir": "/tmp/x",
        "base_url": "http://127.0.0.1:1",
        "model": "m",
        "state": "running",
        "tests_started": 1,
        "user_count": 2,
        "elapsed_s": 3.0,
        "summary": {**summarize(records), "cancelled_in_flight": 1},
        "telemetry": {"server": server or {}},
        "series": list(series),
    }


def _rec(i: int, ttft: float, e2e: float) -> RequestRecord:
    return RequestRecord(
        id=f"cbb-{i}", index=i, prompt_len=4, output_len=3, sent_s=0.0, ttft_s=ttft,
        e2e_s=e2e, tpot_s=(e2e - ttft) / 2, itl_s=[(e2e - ttft) / 2] * 2, end_s=e2e,
        output_tokens_client=3, output_tokens_server=3,
    )  # fmt: skip


def test_empty_run_renders_without_numbers():
    page = render_page(_snap([]))
    assert "0 completed, 0 failed" in page and "1 cancelled in flight" in page
    assert "KV usage: n/a" in page and "<th>TTFT</th>" in page


def test_values_in_ms_and_escaped_labels():
    records = [_rec(0, 0.100, 0.300), _rec(1, 0.200, 0.400)]
    series = [{"t_s": t, "kv_usage": t / 10, "running": 1, "waiting": 0} for t in range(5)]
    page = render_page(
        _snap(records, name="<script>x</script>", series=series, server={"kv_usage": 0.25})
    )
    assert "<script>x" not in page and "&lt;script&gt;x" in page
    assert "<th>TTFT</th><td>150.0</td><td>150.0</td>" in page  # mean, p50 in ms
    assert "2 completed" in page and "KV usage: 25.0%" in page
    assert page.count("<polyline") == 3  # one sparkline per gauge


def test_sparkline_scales_into_its_box():
    svg = _spark([(0.0, 0.0), (1.0, 2.0), (2.0, 1.0)], width=100, height=50)
    points = svg.split('points="')[1].split('"')[0].split()
    xs = [float(p.split(",")[0]) for p in points]
    ys = [float(p.split(",")[1]) for p in points]
    assert xs == [2.0, 50.0, 98.0] and ys == [48.0, 2.0, 25.0]
    assert "<polyline" not in _spark([(0.0, 1.0)])


def test_sessions_line_and_tab_rows(tmp_path):
    def turn(i: int, sid: str, k: int, ttft: float, cached: int) -> RequestRecord:
        rec = _rec(i, ttft, ttft + 0.1)
        rec.session_id, rec.turn, rec.history_len = sid, k, 0 if k == 1 else 20
        rec.prompt_tokens_server = 40
        rec.extra["num_cached_tokens"] = cached
        return rec

    records = [turn(0, "a", 1, 0.300, 0), turn(1, "a", 2, 0.100, 30), turn(2, "b", 1, 0.500, 0)]
    page = render_page(_snap(records))
    assert "sessions: 2 (0 with a failed turn), up to 2 turns" in page
    assert "TTFT p50 turn 1 400.0 ms, later turns 100.0 ms" in page
    assert "prefix-cache hits on later turns 75.0%" in page
    assert "sessions:" not in render_page(_snap([_rec(0, 0.1, 0.2)]))

    settings = LocustSettings(base_url="http://127.0.0.1:1", out_dir=str(tmp_path / "run"))
    wl = load_workload("seed-demo", num_requests=3)
    collector = RunCollector(settings, wl, "digest", {})
    for rec in records:
        collector.add(rec)
    run = SimpleNamespace(collector=collector)  # PageData reads the run's collector only
    rows = {r["metric"]: r for r in PageData(run).tab_rows()}
    assert rows["TTFT turn 1 (ms)"]["count"] == 2 and rows["TTFT turn 1 (ms)"]["p50"] == "400.0"
    assert rows["TTFT later turns (ms)"]["mean"] == "100.0"
    assert rows["prefix-cache hits, later turns (%)"]["mean"] == "75.00"
    collector.close()
