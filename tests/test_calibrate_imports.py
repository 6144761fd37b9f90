"""`cbbench calibrate --from-run` on other tools' result files (tests/fixtures/exchange/, written
by vLLM bench, guidellm, AIPerf and inference-perf themselves), as a new user would try it:
import -> calibrate --from-run -> a hardware JSON that `sim --hardware` loads; or one line
naming the file and what it lacks. Send times a file lacks are reconstructed only where the
run's load fixes them (vLLM bench's closed loop), never invented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.planning.calibration import observed
from cbbench.harness.results.formats.files import parse
from cbbench.reference_engine.execution.cost_model import get_hardware

FX = Path(__file__).parent / "fixtures" / "exchange"
SETTINGS = "max_num_seqs=4,max_num_batched_tokens=512,block_size=16,num_kv_blocks=512"
PER_REQUEST = [
    FX / "vllm-bench" / "vllm-detailed.json",
    FX / "guidellm" / "benchmarks.json.gz",
    FX / "aiperf" / "profile_export.jsonl.gz",
    FX / "inference-perf" / "per_request_lifecycle_metrics.json",
]


def _calibrate(run: Path, out: Path, *extra: str) -> int:
    return main(["calibrate", "--from-run", str(run), "--server-config", SETTINGS,
                 "--model", "tiny", "--holdout", "0.5", "--out", str(out), *extra])  # fmt: skip


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("source", PER_REQUEST, ids=lambda p: p.parent.name)
def test_each_per_request_format_fits_and_sim_loads_the_fit(tmp_path, source, capsys):
    run, fit = tmp_path / "run", tmp_path / "fit.json"
    assert main(["import", str(source), "--out", str(run)]) == 0
    assert _calibrate(run, fit) == 0
    hw = get_hardware(str(fit))
    assert hw.fit["method"] == "from-run" and hw.fit["server_settings"]["max_num_seqs"] == 4
    assert hw.linear["c0"] > 0 or hw.linear["c_tok"] > 0  # it priced the steps
    assert hw.fit["measured_error"]  # the held-back requests' error, for sim/plan intervals
    capsys.readouterr()
    assert main(["sim", "--hardware", str(fit), "--model", "tiny", "--num-requests", "4",
                 "--rate", "2", "--schedulers", "continuous"]) == 0  # fmt: skip
    assert "request overhead from the fit" in capsys.readouterr().out


@pytest.mark.parametrize(
    "source",
    [FX / "vllm-bench" / "vllm-aggregate.json",
     FX / "llm-d-benchmark" / "inference-perf.partial.stage_0.yaml"],  # fmt: skip
    ids=["vllm-bench-aggregate", "llm-d-report"],
)
def test_an_aggregate_only_import_is_one_line(tmp_path, source, capsys):
    run = tmp_path / "agg"
    assert main(["import", str(source), "--out", str(run)]) == 0
    capsys.readouterr()
    assert _calibrate(run, tmp_path / "fit.json") != 0
    err = _one_error_line(capsys)
    assert source.name in err and "aggregates only" in err and "--save-detailed" in err
    assert not (tmp_path / "fit.json").exists()


def _old_vllm(tmp_path: Path, **changes) -> tuple[Path, dict]:
    """The detailed file as vLLM bench wrote it before start_times and latencies were saved
    (benchmarks/benchmark_serving.py, vLLM 0.8/0.9)."""
    data = parse(FX / "vllm-bench" / "vllm-detailed.json")
    for key in ("start_times", "latencies", "queue_times"):
        del data[key]
    data.update(changes)
    src = tmp_path / "old-vllm.json"
    src.write_text(json.dumps(data))
    run = tmp_path / "old"
    assert main(["import", str(src), "--out", str(run)]) == 0
    return run, parse(FX / "vllm-bench" / "vllm-detailed.json")


def test_an_older_vllm_closed_loop_gets_its_sends_back_and_says_how(tmp_path, capsys):
    run, full = _old_vllm(tmp_path)  # --request-rate inf --max-concurrency 2
    reqs = observed(str(run))[0].requests
    t0 = min(full["start_times"])
    true = sorted(t - t0 for t in full["start_times"])
    assert [r.sent_s for r in reqs] == pytest.approx(true, abs=0.002)  # 0.48 ms at most
    ends = [t + e for t, e in zip(full["start_times"], full["latencies"], strict=True)]
    assert [r.e2e_s for r in reqs] == pytest.approx([e - t for e, t in zip(
        ends, full["start_times"], strict=True)], abs=1e-3)  # fmt: skip (ttft + chunk gaps)
    capsys.readouterr()
    assert _calibrate(run, tmp_path / "fit.json") == 0
    out = capsys.readouterr().out
    assert "send times not in" in out and "closed loop of 2" in out
    get_hardware(str(tmp_path / "fit.json"))


def test_an_older_vllm_run_at_a_rate_is_refused_in_one_line(tmp_path, capsys):
    run, _ = _old_vllm(tmp_path, request_rate=4.0, max_concurrency=None)
    capsys.readouterr()
    assert _calibrate(run, tmp_path / "fit.json") != 0
    err = _one_error_line(capsys)
    assert "old-vllm.json" in err and "start_times" in err and "4.0 req/s" in err


def test_what_an_import_lacks_is_asked_for_by_name(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["import", str(PER_REQUEST[2]), "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["calibrate", "--from-run", str(run), "--out", str(tmp_path / "f.json")]) != 0
    err = _one_error_line(capsys)  # the model: the file names only the served name
    assert "pass --model" in err and "'fake-model'" in err
    # the server's settings: no tool's file records them; named with the flag that gives them
    assert main(["calibrate", "--from-run", str(run), "--model", "tiny", "--holdout", "0.5",
                 "--out", str(tmp_path / "f.json")]) == 0  # fmt: skip
    out = " ".join(capsys.readouterr().out.split())
    assert "other tools' result files do not record them" in out
    assert "--server-config max_num_seqs=N,max_num_batched_tokens=N,block_size=N,num_kv_blocks=N" in out


def test_a_file_naming_a_presets_checkpoint_needs_no_model(tmp_path, capsys):
    data = parse(FX / "vllm-bench" / "vllm-detailed.json")
    data["model_id"] = "/models/Qwen2.5-0.5B-Instruct"  # a local copy of the HF checkpoint
    src = tmp_path / "qwen.json"
    src.write_text(json.dumps(data))
    run = tmp_path / "run"
    assert main(["import", str(src), "--out", str(run)]) == 0
    capsys.readouterr()
    fit = tmp_path / "fit.json"
    assert main(["calibrate", "--from-run", str(run), "--server-config", SETTINGS,
                 "--holdout", "0.5", "--out", str(fit)]) == 0  # fmt: skip
    assert "the preset qwen2.5-0.5b" in capsys.readouterr().out
    assert get_hardware(str(fit)).fit["model"] == "qwen2.5-0.5b"
