"""Runs that must not be trusted blindly, and secrets that must not be stored (issue 20):
API keys never reach a run folder, `--warmup -1` is refused, a server that stops answering
makes bench exit 1 saying so, killed runs are flagged by `report` and refused by `gate`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.client.api import fail_record
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.redact import MASK, redact_argv, redact_meta, redact_text
from cbbench.harness.results.run_folder import RunWriter
from cbbench.reference_engine.config.engine_config import EngineConfig
from report_synth import write_run
from servers.fake import Behavior, FakeServerConfig, threaded

from tests.server_support import serve

SECRET = "s3cret-key-42"


def bench_argv(url: str, out: Path, *extra: str) -> list[str]:
    return [
        "bench", "--base-url", url, "--out", str(out), "--no-live", "--workload", "seed-demo",
        "--num-requests", "6", "--concurrency", "2", "--no-server-metrics", "--no-gpu-metrics",
        *extra,
    ]  # fmt: skip


def folder_text(d: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(d.iterdir()) if p.is_file())


def test_api_key_never_reaches_the_run_folder(tmp_path, monkeypatch, capsys):
    with serve(EngineConfig(max_model_len=128), api_key=SECRET) as (url, _):
        argv = bench_argv(url, tmp_path / "r", "--api-key", SECRET)
        monkeypatch.setattr(sys, "argv", ["cbbench", *argv])
        assert main(argv) == 0
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    text = folder_text(tmp_path / "r")
    assert SECRET not in text
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    command = meta["command"]
    assert command[command.index("--api-key") + 1] == MASK
    assert meta["summary"]["counts"]["completed"] == 6  # the key was used, only not stored


def test_api_key_in_equals_form_is_masked(tmp_path, monkeypatch):
    with threaded(FakeServerConfig(Behavior(status=500))) as srv:
        argv = bench_argv(srv.url, tmp_path / "r", f"--api-key={SECRET}")
        monkeypatch.setattr(sys, "argv", ["cbbench", *argv])
        main(argv)
    text = folder_text(tmp_path / "r")
    assert SECRET not in text and f"--api-key={MASK}" in text


def test_an_echoed_key_is_masked_in_records(tmp_path):
    # A server that echoes the key in an error message: the record keeps the error, not the key.
    writer = RunWriter(tmp_path, secrets=(SECRET, None))
    rec = RequestRecord(id="r0", index=0, prompt_len=1, output_len=1)
    fail_record(rec, "http_4xx", f"invalid API key {SECRET!r}")
    writer.add_record(rec)
    writer.close()
    line = (tmp_path / "requests.jsonl").read_text()
    assert SECRET not in line and f"invalid API key '{MASK}'" in line


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--api-key", "k1"], ["--api-key", MASK]),
        (["--api-key=k1"], [f"--api-key={MASK}"]),
        (["--header", "Authorization: Bearer k1"], ["--header", f"Authorization: {MASK}"]),
        (["-H", "x-api-key: k1"], ["-H", f"x-api-key: {MASK}"]),
        (["-Hauthorization:k1"], [f"-Hauthorization: {MASK}"]),
        (["--header=Cookie: a=b"], [f"--header=Cookie: {MASK}"]),
        (["--header", "X-Trace: 1"], ["--header", "X-Trace: 1"]),
        (["--base-url", "http://u:pw@h:1"], ["--base-url", f"http://u:{MASK}@h:1"]),
        (["--rate", "5", "--name", "api-key"], ["--rate", "5", "--name", "api-key"]),
    ],
)
def test_redact_argv(argv, expected):
    assert redact_argv(argv) == expected


def test_redact_meta_and_text():
    meta = {
        "command": ["cbbench", "--api-key", "k1"],
        "target": {"base_url": "https://a:b@h", "api_key": "k1", "num_tokens": 5},
        "settings": {"hf_token": "t", "max_tokens": 7, "eos_token": "</s>"},
    }
    red = redact_meta(meta)
    assert red["command"] == ["cbbench", "--api-key", MASK]
    assert red["target"] == {"base_url": f"https://a:{MASK}@h", "api_key": MASK, "num_tokens": 5}
    assert red["settings"] == {"hf_token": MASK, "max_tokens": 7, "eos_token": "</s>"}
    assert redact_text("bad key k1234 given", ["k1234", None]) == f"bad key {MASK} given"


def test_negative_warmup_is_refused(tmp_path, capsys):
    with threaded(FakeServerConfig()) as srv:
        assert main(bench_argv(srv.url, tmp_path / "r", "--warmup", "-1")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--warmup must be >= 0, got -1" in err
    assert not (tmp_path / "r").exists()


def test_bench_exits_1_when_the_server_stops_answering(tmp_path, capsys):
    # Requests 0-1 are answered, every later one is cut mid-stream (a dying server).
    cfg = FakeServerConfig(Behavior(reset_after_tokens=1), rules={0: Behavior(), 1: Behavior()})
    with threaded(cfg) as srv:
        code = main(bench_argv(srv.url, tmp_path / "r"))
    err = capsys.readouterr().err
    assert code == 1
    assert "the server stopped answering: 4 of 6 requests failed on connection errors" in err
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["status"] == "complete"  # finished: every record is kept
    assert "stopped answering" in meta["summary"]["server_stopped_answering"]
    # ... and `report` flags it.
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "r.html")]) == 0
    assert "stopped answering" in capsys.readouterr().err
    assert "Incomplete:" in (tmp_path / "r.html").read_text()


def test_bench_exits_3_not_1_when_a_minority_fails(tmp_path):
    # the server kept answering: not a failed run (1) but one with failures (3, issue 42)
    cfg = FakeServerConfig(Behavior(), rules={0: Behavior(reset_after_tokens=1)})
    with threaded(cfg) as srv:
        assert main(bench_argv(srv.url, tmp_path / "r")) == 3


@pytest.fixture()
def runs(tmp_path) -> tuple[Path, Path]:
    base = write_run(tmp_path / "base", n=60, seed=1, max_output=8)
    killed = write_run(tmp_path / "killed", n=60, seed=2, max_output=8, meta={"status": "running"})
    return base, killed


def test_report_flags_a_killed_run(runs, tmp_path, capsys):
    base, killed = runs
    md = tmp_path / "r.md"
    html = tmp_path / "r.html"
    argv = ["report", str(base), str(killed), "--out", str(html), "--markdown", str(md)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "killed: did not finish" not in err  # the label leads, then the reason
    assert "warning: killed did not finish" in err and "base" not in err
    assert "**Incomplete:** killed did not finish" in md.read_text()
    assert "Incomplete: killed did not finish" in (tmp_path / "r.html").read_text()


def test_gate_refuses_a_killed_run_unless_allowed(runs, capsys):
    base, killed = runs
    argv = ["gate", "--baseline", str(base), "--candidate", str(killed)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "candidate did not finish" in err
    assert "--allow-incomplete" in err
    assert main([*argv, "--allow-incomplete"]) in (0, 1)  # judged: pass or regression
    interrupted = write_run(
        base.parent / "int", n=60, seed=3, max_output=8, meta={"status": "interrupted"}
    )
    assert main(["gate", "--baseline", str(interrupted), "--candidate", str(base)]) == 2
    assert "baseline was interrupted" in capsys.readouterr().err


@pytest.mark.parametrize(
    "status, words",
    [
        (None, None),
        ("complete", None),
        ("running", "killed"),
        ("interrupted", "Ctrl-C"),
        ("stopped", "web UI"),
        ("odd", "'odd'"),
    ],
)
def test_incomplete_reason(status, words):
    from cbbench.harness.results.outcome import incomplete_reason

    reason = incomplete_reason({} if status is None else {"status": status})
    assert (reason is None) if words is None else (words in reason)
