"""Issue 51 (r51's findings 5-8, 11): one meaning per flag name, one duration rule, a repeated
SLO key refused, --num-requests with --duration. Real commands (`main`, as the console script
runs it) against a scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import pytest
from cbbench.harness.cli import build_parser, main
from cbbench.harness.cli.parsing import old_spelling_notes
from servers.fake import FakeServerConfig, threaded


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with threaded(FakeServerConfig()) as srv:
        yield srv.url


def one_line_error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors exit from the parser
        rc = e.code
    assert rc == 2
    stderr = capsys.readouterr().err
    errors = [ln for ln in stderr.splitlines() if ": error: " in ln]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def _sub(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


SWEEP = ["--base-url", "x", "--out", "o", "--rates", "1"]
# every duration flag: (command, the flags it needs, the flag, its dest)
DURATION_FLAGS = [
    ("bench", ["--base-url", "x"], "--timeout", "timeout"),
    ("bench", ["--base-url", "x"], "--metrics-interval", "metrics_interval"),
    ("sweep", SWEEP, "--level-timeout", "level_timeout"),
    ("sweep", SWEEP, "--max-time", "max_time"),
    ("sweep", SWEEP, "--timeout", "timeout"),
    ("probe", ["--base-url", "http://x"], "--max-time", "max_time"),
    ("locust", ["--base-url", "x"], "--timeout", "timeout"),
    ("calibrate", [], "--min-time", "min_time"),
    ("serve", [], "--max-queue-delay", "max_queue_delay"),
    ("serve", [], "--drain-timeout", "drain_timeout"),
    ("route", ["--replica", "x"], "--poll-interval", "poll_interval"),
]


@pytest.mark.parametrize(("command", "base", "flag", "dest"), DURATION_FLAGS)
def test_every_duration_flag_takes_a_unit_or_bare_seconds(command, base, flag, dest) -> None:
    p = _sub(command)
    for text, seconds in (("250ms", 0.25), ("2", 2.0), ("1.5s", 1.5), ("0.5m", 30.0)):
        assert getattr(p.parse_args([*base, flag, text]), dest) == pytest.approx(seconds), text
    with pytest.raises(SystemExit) as e:
        p.parse_args([*base, flag, "2x"])
    assert e.value.code == 2


def test_the_engine_and_the_harness_read_durations_alike() -> None:
    from cbbench.harness.durations import seconds_arg
    from cbbench.reference_engine.config.options import seconds_arg as engine_seconds

    for text in ("250ms", "2", "1.5s", "2m", "50us", " 3 s ", "1e-3", "0.05"):
        assert seconds_arg(text) == pytest.approx(engine_seconds(text)), text
    for text in ("2x", "", "-1s", "ten"):
        with pytest.raises(argparse.ArgumentTypeError):
            seconds_arg(text)
        with pytest.raises(argparse.ArgumentTypeError):
            engine_seconds(text)


def test_metrics_interval_bounds_name_the_flag(capsys) -> None:
    err = one_line_error(capsys, ["bench", "--base-url", "x", "--metrics-interval", "5ms"])
    assert "argument --metrics-interval: expected a duration between 10ms and 60s" in err


def test_num_requests_and_duration_together_stop_at_whichever_first(server, tmp_path) -> None:
    # the count first: 3 requests, long before 10 (bare: seconds)
    out = tmp_path / "count"
    argv = ["bench", "--base-url", server, "--workload", "prompt=8,output=4", "--no-live"]
    assert main([*argv, "--num-requests", "3", "--duration", "10", "--out", str(out)]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["summary"]["counts"]["total"] == 3
    # the duration first: 5 req/s for 0.6 s sends a few of the 200 asked
    out = tmp_path / "time"
    rc = main([*argv, "--num-requests", "200", "--duration", "600ms", "--request-rate", "5",
               "--metrics-interval", "250ms", "--out", str(out)])  # fmt: skip
    assert rc == 0
    sent = json.loads((out / "run.json").read_text())["summary"]["counts"]["total"]
    assert 1 <= sent < 20


def test_bad_counts_and_durations_name_their_flag(server, capsys) -> None:
    argv = ["bench", "--base-url", server, "--workload", "chat", "--no-live"]
    err = one_line_error(capsys, [*argv, "--num-requests", "-3"])
    assert err.endswith("--num-requests must be >= 1, got -3"), err
    err = one_line_error(capsys, [*argv, "--duration", "10x"])
    assert "--duration: '10x' is not a duration" in err, err


def test_a_repeated_slo_key_is_refused(server, capsys) -> None:
    argv = ["bench", "--base-url", server, "--workload", "chat", "--no-live"]
    err = one_line_error(capsys, [*argv, "--slo", "ttft=1s,ttft=2s"])
    assert "--slo: ttft is given twice (ttft=1s, ttft=2s): give it once" in err, err
    # a bare SLO number stays refused: vLLM's --goodput ttft:200 means milliseconds
    err = one_line_error(capsys, [*argv, "--slo", "ttft=200"])
    assert "write 200ms or 200s" in err


def test_goodput_means_slo_targets_on_sweep_and_plan(capsys) -> None:
    from cbbench.harness.cli.sweep import sweep_options

    base = ["--base-url", "http://127.0.0.1:9", "--out", "o", "--rates", "1"]
    opts = sweep_options(_sub("sweep").parse_args([*base, "--goodput", "ttft:200", "tpot:50"]))
    assert opts.client.slo == "ttft=200ms,tpot=50ms" and opts.goodput == 0.95
    assert opts.client.slo_s() == {"ttft": 0.2, "tpot": 0.05}  # as bench's --goodput
    # a lone share (its meaning there before --goodput-share): read as the share, with a note
    capsys.readouterr()
    opts = sweep_options(_sub("sweep").parse_args([*base, "--goodput", "90%"]))
    assert opts.goodput == pytest.approx(0.9) and opts.client.slo is None
    assert "--goodput takes SLOs (KEY:MS, e.g. ttft:200); the share is --goodput-share" in (
        capsys.readouterr().err
    )
    opts = sweep_options(_sub("sweep").parse_args([*base, "--goodput-share", "0.8"]))
    assert opts.goodput == 0.8
    err = one_line_error(
        capsys, ["sweep", *base, "--slo", "ttft=1s", "--goodput", "ttft:200", "--no-live"]
    )
    assert "--slo and --goodput both set SLOs" in err
    plan = ["plan", "--hardware", "h100", "--price", "1"]
    assert "plan needs --slo (or vLLM's --goodput KEY:MS)" in one_line_error(capsys, plan)
    err = one_line_error(capsys, [*plan, "--slo", "ttft_p99=1s,ttft_p99=2s"])
    assert "--slo: ttft_p99 is given twice" in err
    err = one_line_error(capsys, [*plan, "--goodput", "ttft:abc"])
    assert "--goodput ttft: 'abc' is not a number of milliseconds" in err


def test_run_help_says_its_default_and_has_one_spelling() -> None:
    run = _sub("run")
    text = " ".join(run.format_help().split())
    assert "--schedulers NAME[,NAME], --scheduler NAME[,NAME] batching policies to compare" in text
    assert "(default: all three; --scheduler is the old spelling)" in text
    assert "default: continuous" not in text.split("--schedulers NAME")[1].split("--")[0]
    assert run.parse_args([]).scheduler is None  # run_options: every scheduler
    argv = ["run", "--scheduler", "static"]
    assert old_spelling_notes("cbbench run", argv) == [
        "cbbench run: note: --scheduler is the old spelling of --schedulers (still accepted)"
    ]


def test_output_paths_are_out(server, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    argv = ["bench", "--base-url", server, "--workload", "prompt=8,output=4", "--no-live"]
    assert main([*argv, "--num-requests", "3", "--out", str(run)]) == 0
    html = tmp_path / "r.html"
    assert main(["report", str(run), "--out", str(html)]) == 0 and html.exists()
    csv = tmp_path / "records.csv"
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(csv)]) == 0
    assert csv.read_text().count("\n") == 4  # a header and 3 records
    assert f"3 records -> {csv}" in capsys.readouterr().out
    err = one_line_error(capsys, ["export", str(run), "--out", str(tmp_path / "x.txt")])
    assert "cannot tell the format from the suffix '.txt'" in err
    err = one_line_error(capsys, ["export", str(run), "--out", "a.csv", "--csv", "b.csv"])
    assert "not allowed with argument" in err
    # gate's rules file: --policy-file (--policy is the queue policy in serve, run and sim)
    ns = build_parser().parse_args(["gate", "--baseline", "a", "--candidate", "b",
                                    "--policy-file", "p.toml"])  # fmt: skip
    assert ns.policy == "p.toml"
