"""`cbbench import`: the other tools' real result files (tests/fixtures/exchange/, written by
guidellm, AIPerf, inference-perf and vLLM bench themselves) into run folders that report and
gate read; what a source lacks stays empty; aggregate-only sources are marked and still
compared; bad input is one clear error."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cbbench.harness.cli import main
from cbbench.harness.errors import CbbenchError
from cbbench.harness.gate.judge import run_gate
from cbbench.harness.gate.policy import DEFAULT_POLICY
from cbbench.harness.report import build_report
from cbbench.harness.results.formats import read_source
from cbbench.harness.results.formats.files import parse
from cbbench.harness.results.run_folder import load_run

from tests.report_synth import write_run

FX = Path(__file__).parent / "fixtures" / "exchange"
POLICY = replace(DEFAULT_POLICY, min_requests=5)  # the fixtures are 8 requests each


def _ms(v: float) -> float:
    return v / 1e3


def tool_ttft_p50(path: Path) -> float:
    """TTFT p50 (seconds) as the tool itself computed it, read from the tool's own file."""
    if path.name.startswith("benchmarks"):
        data = parse(path)
        return _ms(
            data["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"]["median"]
        )
    if path.parent.name == "aiperf":
        return _ms(
            parse(FX / "aiperf" / "profile_export_aiperf.json.gz")["time_to_first_token"]["p50"]
        )
    if path.parent.name == "inference-perf":
        s = parse(FX / "inference-perf" / "summary_lifecycle_metrics.json.gz")
        return s["successes"]["latency"]["time_to_first_token"]["median"]
    return _ms(parse(path)["median_ttft_ms"])


PER_REQUEST = [
    (FX / "guidellm" / "benchmarks.json.gz", "guidellm", "0.8.1", 8),
    (FX / "guidellm" / "benchmarks.yaml.gz", "guidellm", "0.8.1", 8),
    (FX / "aiperf", "aiperf", "0.13.0", 8),
    (FX / "inference-perf", "inference-perf", None, 8),
    (FX / "vllm-bench" / "vllm-detailed.json", "vllm-bench", "0.32.0", 8),
]


@pytest.mark.parametrize(("src", "tool", "version", "n"), PER_REQUEST, ids=lambda x: str(x)[-30:])
def test_per_request_files_become_records_and_keep_the_tools_ttft(tmp_path, src, tool, version, n):
    out = tmp_path / "run"
    assert main(["import", str(src), "--out", str(out)]) == 0
    run = load_run(out)
    imp = run.meta["imported"]
    assert (imp["tool"], imp["version"], imp["aggregate_only"]) == (tool, version, False)
    assert imp["definitions"] and len(imp["sha256"]) == 64 and Path(imp["file"]).exists()
    assert len(run.records) == n and all(r.ok for r in run.records)
    for r in run.records:
        assert r.sent_s is not None and r.ttft_s > 0 and r.e2e_s > r.ttft_s
        assert r.first_token_s == pytest.approx(r.sent_s + r.ttft_s, abs=1e-6)
    row = build_report([str(out)]).rows[0]
    file_p50 = tool_ttft_p50(Path(imp["file"]))
    assert row["ttft.p50"] == pytest.approx(file_p50, rel=0.01)  # the tool's own, within 1 %


def test_missing_fields_stay_empty_never_invented(tmp_path):
    runs, fmt, _ = read_source(FX / "guidellm" / "benchmarks.json.gz")
    assert fmt == "guidellm"
    for r in runs[0].records:  # guidellm keeps each request's mean ITL, no gaps
        assert r.itl_s == [] and r.token_times_s == [] and r.server_queue_s is None
        assert r.reasoning_tokens is None
    aiperf = read_source(FX / "aiperf")[0][0].records
    assert all(r.output_tokens_client is not None for r in aiperf)  # AIPerf's tokenizer count
    assert all(r.output_tokens_server == 8 for r in aiperf)  # the server's usage, beside it
    ip = read_source(FX / "inference-perf")[0][0].records
    for r in ip:  # inference-perf keeps every token's arrival: the gaps are real
        assert len(r.token_times_s) == r.output_tokens_server == 8
        assert len(r.itl_s) == 7 and r.last_token_s == r.token_times_s[-1]
    vllm = read_source(FX / "vllm-bench" / "vllm-detailed.json")[0][0].records
    assert all(len(r.itl_s) == 7 and r.client_queue_s is not None for r in vllm)


AGGREGATE = [
    (FX / "aiperf" / "profile_export_aiperf.json.gz", "aiperf"),
    (FX / "inference-perf" / "summary_lifecycle_metrics.json.gz", "inference-perf"),
    (FX / "vllm-bench" / "vllm-aggregate.json", "vllm-bench"),
    (FX / "llm-d-benchmark" / "inference-perf.partial.stage_0.yaml", "llm-d-benchmark-report"),
]


@pytest.mark.parametrize(("src", "tool"), AGGREGATE, ids=lambda x: str(x)[-30:])
def test_aggregate_only_sources_are_marked_and_reported(tmp_path, src, tool):
    out = tmp_path / "agg"
    assert main(["import", str(src), "--out", str(out)]) == 0
    run = load_run(out)
    assert run.records == [] and run.meta["imported"]["aggregate_only"]
    assert run.meta["imported"]["note"] == "imported, aggregate only"
    assert run.meta["imported"]["tool"] == tool
    s = run.meta["summary"]
    assert s["aggregate_only"] and s["ttft_s"]["p50"] > 0 and s["counts"]["completed"] == 8
    rep = build_report([str(out)])
    assert rep.rows[0]["ttft.p50"] == pytest.approx(s["ttft_s"]["p50"])
    assert rep.rows[0]["requests"] == "8/8"
    assert "aggregate only" in rep.markdown() and "aggregate only" in rep.html()
    assert rep.trust_warnings() == []  # no records is what it is, not a damaged file


def test_report_puts_imports_beside_a_cbbench_run_and_names_definitions(tmp_path):
    cb = write_run(tmp_path / "cbbench-run", n=40, workload="fixed-32-8")
    g = tmp_path / "guidellm"
    assert (
        main(
            [
                "import",
                str(FX / "guidellm" / "benchmarks.json.gz"),
                "--out",
                str(g),
                "--workload",
                "fixed-32-8",
            ]
        )
        == 0
    )
    a = tmp_path / "aiperf-agg"
    assert (
        main(["import", str(FX / "aiperf" / "profile_export_aiperf.json.gz"), "--out", str(a)]) == 0
    )
    rep = build_report([str(cb), str(g), str(a)])
    md, html = rep.markdown(), rep.html()
    assert "guidellm TPOT = request latency / output tokens" in md
    assert "its own TTFT p50 51.50 ms" in md  # what guidellm computed, beside the table
    assert "AIPerf TTFT starts at request_start_ns" in html
    assert "different workloads" not in md  # imports that name no workload are not "different"
    assert [r["ttft.p50"] is not None for r in rep.rows] == [True, True, True]


def test_gate_on_an_aggregate_only_import_says_why_there_is_no_interval(tmp_path, capsys):
    base = tmp_path / "vllm-detailed"
    cand = tmp_path / "vllm-agg"
    assert main(["import", str(FX / "vllm-bench" / "vllm-detailed.json"), "--out", str(base)]) == 0
    assert main(["import", str(FX / "vllm-bench" / "vllm-aggregate.json"), "--out", str(cand)]) == 0
    gate = run_gate(load_run(base), load_run(cand), POLICY)
    assert "no per-request records to resample" in gate.note and "candidate" in gate.note
    by = {(r.rule.metric, r.rule.stat): r for r in gate.results}
    ttft = by[("ttft", "p50")]
    assert ttft.low == ttft.high == ttft.estimate  # a point, no interval
    assert ttft.candidate == pytest.approx(
        parse(FX / "vllm-bench" / "vllm-aggregate.json")["median_ttft_ms"] / 1e3
    )
    assert by[("e2e", "p99")].verdict == "n/a"  # vLLM bench printed no E2E by default
    assert "does not report" in by[("e2e", "p99")].note
    capsys.readouterr()
    policy = tmp_path / "p.toml"
    policy.write_text(
        'min_requests = 5\n[[rules]]\nmetric = "ttft"\nstat = "p50"\nmax_increase = 100\n'
    )
    assert (
        main(["gate", "--baseline", str(base), "--candidate", str(cand), "--policy-file", str(policy)])
        == 0
    )
    assert "no confidence interval" in capsys.readouterr().out


def test_gate_compares_a_per_request_import_with_bootstrap_intervals(tmp_path):
    base = tmp_path / "vllm"
    assert main(["import", str(FX / "vllm-bench" / "vllm-detailed.json"), "--out", str(base)]) == 0
    gate = run_gate(load_run(base), load_run(base), POLICY)
    assert gate.passed and not gate.note
    ttft = next(r for r in gate.results if r.rule.metric == "ttft")
    assert ttft.estimate == pytest.approx(1.0) and ttft.low <= 1.0 <= ttft.high


def test_a_sweep_file_becomes_a_folder_of_runs(tmp_path):
    data = parse(FX / "guidellm" / "benchmarks.json.gz")
    second = json.loads(json.dumps(data["benchmarks"][0]))
    second["config"]["strategy"]["streams"] = 4
    data["benchmarks"].append(second)
    src = tmp_path / "two.json.gz"
    with gzip.open(src, "wt", encoding="utf-8") as fh:
        json.dump(data, fh)
    out = tmp_path / "sweep"
    assert main(["import", str(src), "--out", str(out)]) == 0
    index = json.loads((out / "sweep.json").read_text())
    assert index["runs"] == ["0-closed-2", "1-closed-4"]
    assert [lr.label for lr in build_report([str(out)]).runs] == [
        "sweep/0-closed-2",
        "sweep/1-closed-4",
    ]


def test_torn_last_line_of_a_jsonl_export_is_dropped(tmp_path):
    with gzip.open(FX / "aiperf" / "profile_export.jsonl.gz", "rt") as fh:
        lines = fh.read().splitlines()
    src = tmp_path / "profile_export.jsonl"
    src.write_text("\n".join(lines) + "\n" + lines[0][:40])
    runs, fmt, _ = read_source(src)
    assert fmt == "aiperf" and len(runs[0].records) == 8


@pytest.mark.parametrize(
    ("content", "argv", "message"),
    [
        ('{"hello": 1}', [], "not a result file of a known tool"),
        ("{not json", [], "not valid JSON"),
        ('{"hello": 1}', ["--format", "guidellm"], "not a valid guidellm result"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, capsys, content, argv, message):
    src = tmp_path / "x.json"
    src.write_text(content)
    assert main(["import", str(src), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_existing_run_folder_and_missing_file_are_refused(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["import", str(FX / "vllm-bench" / "vllm-detailed.json"), "--out", str(out)]) == 0
    before = (out / "run.json").read_text()
    assert main(["import", str(FX / "vllm-bench" / "vllm-detailed.json"), "--out", str(out)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (out / "run.json").read_text() == before
    with pytest.raises(CbbenchError, match="no such file"):
        read_source(tmp_path / "nothing.json")


def test_import_keeps_the_files_numbers_exactly():
    """The TPOT the records give is cbbench's definition over the tool's own times."""
    data = parse(FX / "vllm-bench" / "vllm-detailed.json")
    recs = read_source(FX / "vllm-bench" / "vllm-detailed.json")[0][0].records
    assert [r.ttft_s for r in recs] == data["ttfts"]
    assert [r.e2e_s for r in recs] == data["latencies"]
    tpot = [
        (e - t) / (n - 1)
        for e, t, n in zip(data["latencies"], data["ttfts"], data["output_lens"], strict=True)
    ]
    assert np.allclose([r.tpot_s for r in recs], tpot)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("guidellm-benchmarks.json.gz", "imported"),
        ("aiperf-profile_export.jsonl", "http_500"),
        ("inference-perf-per_request_lifecycle_metrics.json", "HTTP Error 500"),
    ],
)
def test_failed_requests_as_each_tool_writes_them(tmp_path, name, kind):
    runs, _, _ = read_source(FX / "failed" / name)
    recs = runs[0].records
    assert recs and all(r.status == "error" and r.ttft_s is None for r in recs)
    assert all("500" in r.error and r.error_kind == kind for r in recs)
    out = tmp_path / "failed"
    assert main(["import", str(FX / "failed" / name), "--out", str(out)]) == 0
    row = build_report([str(out)]).rows[0]
    assert row["error_rate"] == 1.0 and row["ttft.p50"] is None


def test_a_sampled_guidellm_file_says_its_records_are_a_sample(tmp_path):
    data = parse(FX / "guidellm" / "benchmarks.json.gz")
    bench = data["benchmarks"][0]
    bench["requests"]["successful"] = bench["requests"]["successful"][:5]  # --sample-size 5
    imp = read_source_data(tmp_path, data)
    assert len(imp.records) == 5
    assert any("keeps 5 of guidellm's 8 requests" in d for d in imp.definitions)
    full = read_source(FX / "guidellm" / "benchmarks.json.gz")[0][0]
    assert not any("sample" in d for d in full.definitions)


def read_source_data(tmp_path, data):
    src = tmp_path / "benchmarks.json"
    src.write_text(json.dumps(data))
    return read_source(src)[0][0]


def test_an_older_vllm_file_without_send_times_keeps_its_latencies(tmp_path):
    data = parse(FX / "vllm-bench" / "vllm-detailed.json")
    del data["start_times"]  # vLLM bench files before start_times were saved
    src = tmp_path / "old.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "old"
    assert main(["import", str(src), "--out", str(out)]) == 0
    run = load_run(out)
    assert all(r.sent_s is None and r.ttft_s is not None for r in run.records)
    row = build_report([str(out)]).rows[0]
    assert row["ttft.p50"] == pytest.approx(data["median_ttft_ms"] / 1e3, rel=0.01)
    assert row["request_throughput"] == pytest.approx(data["completed"] / data["duration"])


def test_gate_holds_an_import_to_the_comparability_rule(tmp_path):
    """guidellm's run was a closed loop on the chat API: against an open-loop run of another
    API the gate refuses, as for any two runs, unless told --allow-incomparable."""
    base = write_run(
        tmp_path / "open",
        n=30,
        workload="fixed-32-8",
        meta={"target": {"endpoint": "completions", "model": "fake-model"}},
    )
    cand = tmp_path / "guidellm"
    argv = ["import", str(FX / "guidellm" / "benchmarks.json.gz"), "--out", str(cand)]
    assert main([*argv, "--workload", "fixed-32-8"]) == 0
    assert load_run(cand).meta["target"]["endpoint"] == "chat"  # cbbench's name for it
    with pytest.raises(CbbenchError, match="not comparable: endpoint"):
        run_gate(load_run(base), load_run(cand), POLICY)
    gate = run_gate(load_run(base), load_run(cand), POLICY, allow_incomparable=True)
    assert any(d.aspect == "endpoint" for d in gate.differences)


def test_diagnose_on_an_aggregate_only_import_says_it_has_nothing_to_read(tmp_path, capsys):
    out = tmp_path / "agg"
    assert main(["import", str(FX / "vllm-bench" / "vllm-aggregate.json"), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["diagnose", str(out)]) == 0
    text = capsys.readouterr().out
    assert "imported aggregate only (from vllm-bench): no per-request records" in text
    assert "no rule saw its symptom" not in text  # not a clean bill of health
    assert "no successful per-request record to read" in text
