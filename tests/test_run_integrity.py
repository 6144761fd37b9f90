"""A run folder knows its own record count (run.json `records`) and says when requests.jsonl
holds fewer (cut, torn last line): `report`, `diagnose`, `gate` and `export` each say how
many are missing (issue 51 #3); a killed run is called partial by `diagnose` (#12)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from servers.fake import Behavior, FakeServerConfig, threaded


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("integrity") / "whole"
    with threaded(FakeServerConfig(Behavior(ttft_s=0.002, itl_s=0.001))) as srv:
        argv = ["bench", "--base-url", srv.url, "--out", str(out), "--no-live"]
        argv += ["--workload", "seed-demo", "--num-requests", "30", "--concurrency", "4"]
        argv += ["--no-server-metrics", "--no-gpu-metrics", "--warmup", "2"]
        assert main(argv) == 0
    return out


def cut(src: Path, dst: Path, keep: int) -> Path:
    shutil.copytree(src, dst)
    lines = (src / "requests.jsonl").read_text().splitlines(keepends=True)
    measured = [x for x in lines if not json.loads(x)["warmup"]]
    torn = measured[keep][: len(measured[keep]) // 2]  # the line being written when it died
    (dst / "requests.jsonl").write_text("".join(measured[:keep]) + torn)
    return dst


def test_run_json_counts_its_records(whole_run: Path) -> None:
    meta = json.loads((whole_run / "run.json").read_text())
    assert meta["records"] == {"written": 32, "measured": 30}


def test_every_command_says_how_many_records_are_missing(whole_run, tmp_path, capsys) -> None:
    bad = cut(whole_run, tmp_path / "cut", 11)
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err
    assert "holds 11 of the 30 measured records" in err and "19 missing" in err, err
    assert "torn" in err
    assert main(["diagnose", str(bad)]) == 0
    assert "19 missing" in capsys.readouterr().out
    assert main(["export", str(bad), "--csv", str(tmp_path / "x.csv")]) == 0
    assert "19 missing" in capsys.readouterr().err
    assert (
        main(["gate", "--baseline", str(whole_run), "--candidate", str(bad)]) == 2
    )  # refused: a damaged candidate
    err = capsys.readouterr().err
    assert "candidate is damaged" in err and "19 missing" in err and "Traceback" not in err
    main(
        ["gate", "--baseline", str(whole_run), "--candidate", str(bad), "--allow-incomplete"]
    )  # judged, but flagged
    assert "19 missing" in capsys.readouterr().err


def test_a_whole_run_says_nothing(whole_run, tmp_path, capsys) -> None:
    assert main(["report", str(whole_run), "--out", str(tmp_path / "r.html")]) == 0
    assert "missing" not in capsys.readouterr().err
    assert main(["diagnose", str(whole_run)]) == 0
    out = capsys.readouterr().out
    assert "missing" not in out and "partial" not in out


def test_a_killed_run_is_partial_in_diagnose(whole_run, tmp_path, capsys) -> None:
    killed = cut(whole_run, tmp_path / "killed", 20)
    meta = json.loads((killed / "run.json").read_text())
    for key in ("summary", "records"):
        meta.pop(key)
    meta["status"] = "running"  # as a killed process leaves it
    (killed / "run.json").write_text(json.dumps(meta))
    assert main(["diagnose", str(killed)]) == 0
    out = capsys.readouterr().out
    assert "partial: the run did not finish" in out and "torn" in out, out
