"""What `cbbench bench` says about a run is true (issue 42, findings 1, 2, 3 and 14): SLO
durations carry a unit (vLLM's `--goodput` is milliseconds), failures print the server's
own message and set the exit code, vLLM's spellings are accepted with vLLM's meaning."""

from __future__ import annotations

import argparse
import json
import re
import sys

import pytest
from cbbench.harness.cli import build_parser, main
from cbbench.harness.load.options import ClientOptions, LoadOptions
from cbbench.harness.results.outcome import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SOME_FAILED,
    all_failed,
)
from cbbench.harness.results.run_folder import load_run
from servers.fake import Behavior, FakeServerConfig, threaded


def bench(url: str, out, *extra: str) -> list[str]:
    return [
        "bench", "--base-url", url, "--out", str(out), "--no-live", "--no-server-metrics",
        "--no-gpu-metrics", *extra,
    ]  # fmt: skip


def run(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["cbbench", *argv])
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


# finding 1 ---------------------------------------------------------------------------------


def test_a_bare_slo_number_is_one_error_naming_the_fix(tmp_path, monkeypatch, capsys):
    # it was read as 200 seconds and the run reported 100 % within SLO
    rc, out, err = run(bench("http://127.0.0.1:9", tmp_path / "r", "--slo", "ttft=200"),
                       monkeypatch, capsys)  # fmt: skip
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "--slo ttft: '200' has no unit: write 200ms or 200s" in err
    rc, _, err = run(bench("http://127.0.0.1:9", tmp_path / "r", "--slo", "ttft:200"),
                     monkeypatch, capsys)  # fmt: skip
    assert rc == 2 and "--goodput ttft:200" in err  # vLLM's spelling belongs to --goodput


def test_vllm_goodput_spelling_is_milliseconds(tmp_path, monkeypatch, capsys):
    with threaded(FakeServerConfig(Behavior(ttft_s=0.3, itl_s=0.001))) as srv:
        common = ("--workload", "seed-demo")
        rc, out, _ = run(bench(srv.url, tmp_path / "a", *common, "--goodput", "ttft:200",
                               "tpot:50"), monkeypatch, capsys)  # fmt: skip
        assert rc == EXIT_OK
        rc, _, _ = run(bench(srv.url, tmp_path / "b", *common, "--slo", "ttft=1s"),
                       monkeypatch, capsys)  # fmt: skip
        assert rc == EXIT_OK
    goodput = load_run(tmp_path / "a").meta["summary"]["goodput"]
    assert goodput["slo_s"] == pytest.approx({"ttft": 0.2, "tpot": 0.05})
    assert goodput["fraction"] == 0.0  # every TTFT is ~300 ms > 200 ms
    assert "0.0% within SLO" in out
    assert load_run(tmp_path / "b").meta["summary"]["goodput"]["fraction"] == 1.0


# finding 2 ---------------------------------------------------------------------------------


def test_same_client_error_stops_early_with_the_servers_message(tmp_path, monkeypatch, capsys):
    # `--model gpt-4` on a server that does not serve it: 5 failures, exit 0, reason hidden
    with threaded(FakeServerConfig(Behavior(status=404))) as srv:
        argv = bench(srv.url, tmp_path / "r", "--workload", "mixed", "--num-requests", "60",
                     "--rate", "20", "--seed", "1")  # fmt: skip
        rc, out, err = run(argv, monkeypatch, capsys)
    assert rc == EXIT_FAILED
    assert "stopped early" in err and "HTTP 404: scripted failure 404" in err  # verbatim
    assert "x HTTP 404: scripted failure 404" in out  # the top reasons, digits kept
    meta = load_run(tmp_path / "r").meta
    assert meta["status"] == "stopped-early" and not meta["interrupted"]  # not complete
    summary = meta["summary"]
    assert "stopped early" in summary["stopped_early"]
    assert summary["counts"]["total"] < 30  # 60 were due over 3 s; it stopped after ~5
    assert summary["errors_by_reason"] == {"HTTP 404: scripted failure 404": summary[
        "counts"]["failed"]}  # fmt: skip


def test_some_failures_exit_3_and_print_the_top_reasons(tmp_path, monkeypatch, capsys):
    rules = {1: Behavior(status=500), 4: Behavior(status=503)}
    with threaded(FakeServerConfig(Behavior(itl_s=0.001), rules=rules)) as srv:
        rc, out, err = run(bench(srv.url, tmp_path / "r", "--workload", "seed-demo"),
                           monkeypatch, capsys)  # fmt: skip
    assert rc == EXIT_SOME_FAILED, err
    assert "failed 2 of 6; top reasons:" in out
    # one group (numbers aside the messages are alike), shown by its first real message
    assert re.search(r"2 x HTTP (500|503): scripted failure \1\n", out), out


def test_every_request_failing_exits_1_naming_the_reason(tmp_path, monkeypatch, capsys):
    with threaded(FakeServerConfig(Behavior(status=500))) as srv:
        rc, _, err = run(bench(srv.url, tmp_path / "r", "--workload", "seed-demo"),
                         monkeypatch, capsys)  # fmt: skip
    assert rc == EXIT_FAILED
    assert "all 6 requests failed: HTTP 500: scripted failure 500" in err


def test_prompts_past_the_context_name_the_way_out():
    # `--workload agent` on the tiny model (a 2,048-token context): every session's first
    # step failed and the line named the overflow but not what to run instead
    reason = "HTTP 400: prompt has 5820 tokens; the model's context is 2048"
    line = all_failed({"counts": {"total": 2, "completed": 0},
                       "errors_by_reason": {reason: 2}})  # fmt: skip
    assert line and line.startswith(f"all 2 requests failed: {reason} (")
    assert "docs/specs/agent-small.toml" in line and "longer-context model" in line
    other = all_failed({"counts": {"total": 2, "completed": 0},
                        "errors_by_reason": {"HTTP 500: boom": 2}})  # fmt: skip
    assert other == "all 2 requests failed: HTTP 500: boom"


# finding 14 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--random-input-len", "16", "--random-output-len", "4"],
        ["--workload", "prompt=16,output=4"],
    ],
)
def test_fixed_lengths_vllm_style(tmp_path, monkeypatch, capsys, flags):
    with threaded(FakeServerConfig(Behavior(itl_s=0.001))) as srv:
        rc, _, err = run(bench(srv.url, tmp_path / "r", *flags, "--num-requests", "5",
                               "--ignore-eos"), monkeypatch, capsys)  # fmt: skip
    assert rc == EXIT_OK, err
    run_ = load_run(tmp_path / "r")
    assert [(r.prompt_len, r.output_len) for r in run_.records] == [(16, 4)] * 5
    assert run_.meta["workload"]["name"] == "fixed-16-4"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--burstiness", "0.5"], "--burstiness 0.5 shapes the gaps between --request-rate"),
        (["--random-input-len", "8", "--workload", "chat"], "replace --workload chat"),
        (["--workload", "prompt=8"], "give output=TOKENS too"),
        (["--goodput", "ttft=200"], "--goodput: 'ttft=200': expected KEY:MILLISECONDS"),
        (["--goodput", "ttft:fast"], "--goodput ttft: 'fast' is not a number of milliseconds"),
        # a bare number is seconds, as on every duration flag (tests/test_one_spelling.py)
        (["--duration", "5x"], "--duration: '5x' is not a duration"),
    ],
)
def test_vllm_spellings_misused_are_one_line(tmp_path, monkeypatch, capsys, flags, message):
    rc, _, err = run(bench("http://127.0.0.1:9", tmp_path / "r", *flags), monkeypatch, capsys)
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_ignore_eos_is_sent_even_with_a_plain_body():
    parser = build_parser(only="bench")
    args = parser.parse_args(["bench", "--base-url", "u", "--no-extensions", "--ignore-eos"])
    assert ClientOptions.from_args(args).extra_body == {"ignore_eos": True}
    args = parser.parse_args(["bench", "--base-url", "u", "--burstiness", "0.5", "--rate", "4"])
    assert LoadOptions.from_args(args).burstiness == 0.5
    assert LoadOptions.from_args(parser.parse_args(["bench", "--base-url", "u"])).workload == (
        "mixed"
    )


def test_bench_help_gives_defaults_and_help_for_the_common_flags():
    parser = build_parser(only="bench")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = {o: a for a in sub.choices["bench"]._actions for o in a.option_strings}
    for flag, default in (
        ("--num-requests", "the workload's own count"),
        ("--endpoint", "(default: completions)"),
        ("--timeout", "default: 600s)"),
        ("--warmup", "(default: 0)"),
        ("--workers", "(default: 1)"),
        ("--burstiness", "needs --rate"),
    ):
        assert default in (actions[flag].help or ""), flag
    for flag in ("--goodput", "--random-input-len", "--random-output-len", "--ignore-eos"):
        assert flag in actions
    json.dumps([a.help for a in actions.values()])  # every help is plain text


# finding 11 --------------------------------------------------------------------------------


def test_run_with_too_few_requests_gets_a_caution():
    from cbbench.harness.studies.run_demo import too_few_requests

    # `cbbench run --num-requests 48` showed static beating continuous, with no caution
    caution = too_few_requests(48, 8, ["static", "dynamic", "continuous"])
    assert caution and "48 requests are 6 batches of B=8" in caution
    assert "--num-requests 256 or more (32 batches)" in caution
    assert too_few_requests(128, 8, ["static", "continuous"])  # still put static ahead
    assert too_few_requests(256, 8, ["static", "dynamic", "continuous"]) is None  # the default
    assert too_few_requests(48, 8, ["continuous"]) is None  # nothing to compare
