"""Each diagnosis rule fires on a run where the reference engine is set up to cause its
symptom, and no rule fires on a healthy run. The runs are real: `cbbench serve` (simulated
executor, paced to the wall clock) on 127.0.0.1, driven by cbbench's own load generator; each
scenario runs once per session, only when a test asks for it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.diagnose.base import ENGINES
from cbbench.harness.results.run_folder import load_run

from tests.diagnose_support import demo_runs, provoke


@pytest.fixture(scope="session")
def provoked(tmp_path_factory):
    root = tmp_path_factory.mktemp("diagnose")
    cache: dict[str, Path] = {}

    def get(scenario: str) -> Path:
        if scenario not in cache:
            cache[scenario] = provoke(scenario, root)
        return cache[scenario]

    return get


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> dict[str, Path]:
    """`cbbench run` (its defaults, a simulated device) on 48 requests of its workload."""
    return demo_runs(tmp_path_factory.mktemp("demo"))


def findings(run_dir: Path) -> dict:
    return {f.rule: f for f in diagnose_run(load_run(run_dir)).findings}


# `cbbench run`'s three schedulers: the cause each one has, and the verdicts that misname it
DEMO_VERDICTS = {
    # a run-to-completion batch holds its finished members' slots (and static: KV reserved
    # at max_model_len per slot) until its longest member ends; nothing waits for a batch to
    # fill (all requests are there at once) and no prompt joins a running batch
    "static": ("hol-blocking", {"queue-delay", "prefill-stall", "batch-cap", "kv-pressure"}),
    "dynamic": ("hol-blocking", {"queue-delay", "prefill-stall", "batch-cap", "kv-pressure"}),
    # every slot refilled at the next step: the cap of 8 sequences is what requests wait for
    "continuous": ("batch-cap", {"hol-blocking", "queue-delay", "kv-pressure", "low-concurrency"}),
}


@pytest.mark.parametrize("scheduler", list(DEMO_VERDICTS))
def test_demo_runs_name_the_cause_their_scheduler_has(demo, scheduler: str) -> None:
    d = diagnose_run(load_run(demo[scheduler]))
    assert d.engine == "cbbench" and d.scheduler == scheduler and d.requests == 48
    found = {f.rule for f in d.findings}
    want, wrong = DEMO_VERDICTS[scheduler]
    assert want in found, f"{scheduler}: {want} silent; found {sorted(found)}; {d.vitals}"
    assert not found & wrong, f"{scheduler}: misnamed as {sorted(found & wrong)}; {d.vitals}"


def test_demo_run_to_completion_evidence(demo) -> None:
    static = findings(demo["static"])["hol-blocking"]
    v = static.values
    assert v["mode"] == "run-to-completion" and "run-to-completion" in static.title
    assert v["slots"] == 8 and v["idle_share"] >= 0.3 and v["batch_share"] >= 0.5
    assert v["running_drops"] >= 1 and v["refill_p50_s"] > 0
    assert v["kv_reserved_share"] >= 0.5  # the CPU pool is 8 slots x max_model_len, all reserved
    text = " ".join(static.evidence)
    assert "held by requests that had already finished" in text and "--max-model-len" in text
    fix = static.fixes["cbbench"]
    assert "--scheduler continuous (continuous batching" in fix and "--max-model-len" in fix
    # the KV figure is labelled by its window, and the run's mean is the report table's number
    from cbbench.harness.diagnose.base import pct
    from cbbench.harness.report.table import _series_stats

    table_mean = _series_stats(load_run(demo["static"]).timeseries, "kv_usage", 1.0)["mean"]
    assert v["kv_usage_run_mean"] == pytest.approx(table_mean)
    assert f"KV usage {pct(v['kv_usage_mean'])} on average while requests waited" in text
    if pct(table_mean) != pct(v["kv_usage_mean"]):
        assert f"the run's mean, as the report's table: {pct(table_mean)}" in text
    dynamic = findings(demo["dynamic"])["hol-blocking"].values
    assert dynamic["mode"] == "run-to-completion" and dynamic["idle_share"] >= 0.3
    assert dynamic["kv_usage_mean"] < 0.5  # prompt + max_tokens reserved: memory to spare
    cap = findings(demo["continuous"])["batch-cap"]
    assert cap.values["running_max"] == 8 and cap.values["kv_usage_max"] < 0.6


def test_healthy_run_has_no_findings(provoked) -> None:
    d = diagnose_run(load_run(provoked("healthy")))
    assert d.engine == "cbbench" and d.scheduler == "continuous" and d.requests == 32
    assert d.findings == [], [f.title for f in d.findings]


@pytest.mark.parametrize(
    ("scenario", "rule"),
    [
        ("kv-pressure", "kv-pressure"),
        ("batch-cap", "batch-cap"),
        ("low-concurrency", "low-concurrency"),
        ("hol-blocking", "hol-blocking"),
        ("hol-blocking", "length-skew"),
        ("queue-delay", "queue-delay"),
        ("prefill-stall", "prefill-stall"),
        ("client-bound", "client-bound"),
        ("errors", "errors"),
        ("scheduling-delay", "scheduling-delay"),
    ],
)
def test_rule_fires_on_its_provoked_run(provoked, scenario: str, rule: str) -> None:
    found = findings(provoked(scenario))
    assert rule in found, f"{rule} silent on {scenario}; found {sorted(found)}"
    f = found[rule]
    assert f.evidence and all(isinstance(e, str) and e for e in f.evidence)
    assert set(f.fixes) == set(ENGINES) and all(f.fixes.values())
    assert any(ch.isdigit() for e in f.evidence for ch in e), "evidence carries numbers"


def test_evidence_numbers_match_the_setup(provoked) -> None:
    kv = findings(provoked("kv-pressure"))["kv-pressure"]
    assert kv.values["preemptions"] >= 1 and kv.values["kv_usage_max"] >= 0.9
    assert kv.time_ranges, "when the pool was full"
    cap = findings(provoked("batch-cap"))["batch-cap"]
    assert cap.values["running_max"] == 2  # --max-num-seqs 2
    q = findings(provoked("queue-delay"))["queue-delay"]
    assert 0.3 <= q.values["queue_p50_s"] <= 0.6  # --max-queue-delay 0.4
    hol = findings(provoked("hol-blocking"))["hol-blocking"]
    assert hol.values["blocked_fraction"] >= 0.5
    stall = findings(provoked("prefill-stall"))["prefill-stall"]
    assert stall.values["ratio"] >= 3
    err = findings(provoked("errors"))["errors"]
    assert err.values["by_kind"].get("http_4xx", 0) >= 1 and "429" in " ".join(err.evidence)
    gap = findings(provoked("scheduling-delay"))["scheduling-delay"]
    assert 0.010 <= gap.values["step_gap_p50_s"] <= 0.025  # 12 ms + 8 x 0.5 ms of host work
    assert gap.values["gap_share"] >= 0.4


def test_rules_that_do_not_apply_stay_silent_on_provoked_runs(provoked) -> None:
    # continuous batching has no batching delay and no head-of-line blocking
    for scenario in ("kv-pressure", "batch-cap", "prefill-stall"):
        found = findings(provoked(scenario))
        assert "queue-delay" not in found and "hol-blocking" not in found, scenario
    # a full KV pool is not "memory to spare"
    found = findings(provoked("kv-pressure"))
    assert "batch-cap" not in found and "low-concurrency" not in found


def test_cli_text_json_strict_and_report_section(provoked, capsys, tmp_path: Path) -> None:
    from cbbench.harness.cli import main

    hol, healthy = provoked("hol-blocking"), provoked("healthy")
    assert main(["diagnose", str(hol), str(healthy)]) == 0
    out = capsys.readouterr().out
    assert (
        "head-of-line blocking" in out
        and "fix (cbbench): cbbench serve --scheduler continuous" in out
    )
    assert "no findings" in out  # the healthy run
    assert "vitals: running" in out and "TTFT p50" in out and "KV max" in out
    assert main(["diagnose", "--json", "--all-engines", str(hol)]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    rules = {f["rule"] for f in data[0]["findings"]}
    assert data[0]["vitals"]["waiting"]["max"] >= 1 and data[0]["vitals"]["ttft_s"]["p50"] > 0
    assert {"hol-blocking", "length-skew"} <= rules
    assert main(["diagnose", "--strict", str(hol)]) == 1
    assert main(["diagnose", "--strict", str(healthy)]) == 0
    capsys.readouterr()
    assert main(["diagnose", "--rules", "nope", str(hol)]) == 2
    assert "unknown rule 'nope'" in capsys.readouterr().err
    assert main(["diagnose", str(tmp_path / "missing")]) == 2
    assert "no such run folder" in capsys.readouterr().err
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    assert main(["report", str(hol), str(healthy), "-o", str(html), "--markdown", str(md)]) == 0
    page = html.read_text()
    assert "<h2>Diagnosis</h2>" in page and "head-of-line blocking" in page
    assert "triton" in page  # every engine's fix in the HTML
    text = md.read_text()
    assert "#### Diagnosis" in text and "`hol-blocking`" in text and "&#x27;" not in text


def test_rules_read_their_own_evidence(demo, provoked, tmp_path: Path) -> None:
    """Issue 51: no advice the run's own evidence contradicts. The dynamic demo run (KV mostly
    free: dynamic reserves prompt + max_tokens) gets no smaller --max-model-len; a continuous
    server with 2 slots and short requests behind long ones is not head-of-line blocked by
    request-level batching (it is told nothing about --scheduler continuous)."""
    dynamic = findings(demo["dynamic"])["hol-blocking"]
    assert dynamic.values["kv_usage_mean"] < 0.5
    assert "--max-model-len" not in dynamic.fixes["cbbench"]
    assert "--scheduler continuous" in dynamic.fixes["cbbench"]
    static = findings(demo["static"])["hol-blocking"]
    assert "--max-model-len" in static.fixes["cbbench"]  # its reservations filled the pool


    # the provoked head-of-line run's request times, on a server whose run.json says it is
    # continuous (iteration-level): the rule must not name request-level batching there
    import json
    import shutil

    src = provoked("hol-blocking")
    assert "hol-blocking" in findings(src)
    run = tmp_path / "said-continuous"
    shutil.copytree(src, run)
    meta = json.loads((run / "run.json").read_text())
    meta["target"]["scheduler"] = "continuous"
    (run / "run.json").write_text(json.dumps(meta))
    found = findings(run)
    assert "hol-blocking" not in found, found["hol-blocking"].evidence
    for f in found.values():
        assert "--scheduler continuous" not in f.fixes["cbbench"], f.rule
