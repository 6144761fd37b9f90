"""Every flag of the command-line parsers as they were before the options layer (commit
d438e77: harness/cmd_*.py, reference_engine/cmd_serve.py and cmd_calibrate.py) is still
accepted by today's `cbbench` (issue 13: "every existing CLI flag still works").

OLD_FLAGS is data: each command's old flags with a value its old parser took (None: a
switch). Parsing `cbbench CMD FLAG [VALUE]` must succeed and set the flag's destination.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from cbbench.harness.cli import build_parser, main

# positionals a command needs before any flag can be parsed
BASE_ARGV = {"export": ["run-folder"], "report": ["run-folder"], "workload": ["list"]}
# one of a required either-or group, given unless the flag under test belongs to that group
EITHER = {"sweep": ["--rates", "1,2"]}

OLD_FLAGS: dict[str, list[tuple[str, str | None]]] = {
    "bench": [
        ("--api-key", "k"),
        ("--arrival", "poisson"),
        ("--base-url", "http://127.0.0.1:9"),
        ("--burstiness", "2.0"),
        ("--duration", "5"),
        ("--endpoint", "completions"),
        ("--extra-body", '{"a": 1}'),
        ("--gpus", "0"),
        ("--http-client", "raw"),
        ("--max-concurrency", "7"),
        ("--metrics-interval", "0.5"),
        ("--metrics-url", "http://127.0.0.1:9/metrics"),
        ("--model", "tiny"),
        ("--name", "n"),
        ("--no-extensions", None),
        ("--no-gpu-metrics", None),
        ("--no-live", None),
        ("--no-server-metrics", None),
        ("--no-stream", None),
        ("--num-requests", "7"),
        ("--out", "o"),
        ("--request-rate", "7"),
        ("--seed", "7"),
        ("--slo", "ttft=2s"),
        ("--text-prompts", None),
        ("--timeout", "30"),
        ("--tokenizer", "t"),
        ("--warmup", "7"),
        ("--workers", "2"),
        ("--workload", "chat"),
    ],
    "calibrate": [
        ("--batch-sizes", "1,2"),
        ("--context-lens", "16"),
        ("--device", "cuda"),
        ("--dtype", "float16"),
        ("--min-time", "0.1"),
        ("--model", "tiny"),
        ("--name", "n"),
        ("--out", "o"),
        ("--prefill-lens", "16"),
        ("--repeats", "7"),
        ("--threads", "7"),
    ],
    "compare-engines": [
        ("--engines", "reference"),
        ("--max-batch", "7"),
        ("--model", "tiny"),
        ("--num-requests", "7"),
        ("--out", "o"),
        ("--seed", "7"),
        ("--threads", "7"),
        ("--vllm-python", "py"),
        ("--workload", "chat"),
    ],
    "export": [("--csv", "x.csv"), ("--parquet", "x.parquet")],
    "gate": [
        ("--baseline", "b"),
        ("--candidate", "c"),
        ("--junit", "j.xml"),
        ("--markdown", "m.md"),
        ("--policy", "p.toml"),
    ],
    "locust": [
        ("--api-key", "k"),
        ("--arrival", "poisson"),
        ("--base-url", "http://127.0.0.1:9"),
        ("--burstiness", "2.0"),
        ("--closed-loop", None),
        ("--csv", "x.csv"),
        ("--cycle", None),
        ("--endpoint", "completions"),
        ("--expect-workers", "7"),
        ("--extra-body", '{"a": 1}'),
        ("--gpus", "0"),
        ("--headless", None),
        ("--html", "h.html"),
        ("--master", None),
        ("--master-bind-host", "127.0.0.2"),
        ("--master-host", "127.0.0.2"),
        ("--master-port", "7"),
        ("--metrics-interval", "0.5"),
        ("--metrics-url", "http://127.0.0.1:9/metrics"),
        ("--model", "tiny"),
        ("--name", "n"),
        ("--no-extensions", None),
        ("--no-gpu-metrics", None),
        ("--no-itl-events", None),
        ("--no-server-metrics", None),
        ("--no-stream", None),
        ("--num-requests", "7"),
        ("--out", "o"),
        ("--pacing", "poisson"),
        ("--processes", "7"),
        ("--rate", "7"),
        ("--run-time", "7"),
        ("--seed", "7"),
        ("--slo", "ttft=2s"),
        ("--spawn-rate", "7"),
        ("--text-prompts", None),
        ("--timeout", "30"),
        ("--tokenizer", "t"),
        ("--users", "7"),
        ("--web-host", "127.0.0.2"),
        ("--web-port", "7"),
        ("--worker", None),
        ("--workload", "chat"),
    ],
    "report": [("--markdown", "m.md"), ("--no-html", None), ("--output", "r.html")],
    "reproduce": [
        ("--batch-size", "7"),
        ("--cpu-batch-size", "7"),
        ("--cpu-model", "tiny"),
        ("--cpu-requests", "7"),
        ("--cpu-scale", "7"),
        ("--hardware", "a100"),
        ("--model", "tiny"),
        ("--num-requests", "7"),
        ("--out", "o"),
        ("--sim-only", None),
    ],
    "run": [
        ("--attention-backend", "torch"),
        ("--batch-size", "7"),
        ("--block-size", "7"),
        ("--concurrency", "7"),
        ("--device", "cuda"),
        ("--drain-timeout", "0.5"),
        ("--dtype", "float16"),
        ("--enable-prefix-caching", None),
        ("--executor", "real"),
        ("--hardware", "a100"),
        ("--kv-cache-memory-gb", "1.5"),
        ("--max-batch-size", "7"),
        ("--max-model-len", "7"),
        ("--max-num-batched-tokens", "7"),
        ("--max-num-seqs", "7"),
        ("--max-prefills-per-step", "7"),
        ("--max-queue-delay", "0.02"),
        ("--max-queue-wait", "7"),
        ("--max-waiting", "7"),
        ("--model", "tiny"),
        ("--no-enable-chunked-prefill", None),
        ("--no-live", None),
        ("--no-report", None),
        ("--num-kv-blocks", "7"),
        ("--num-requests", "7"),
        ("--out", "o"),
        ("--policy", "fcfs"),
        ("--preferred-batch-sizes", "1,2"),
        ("--rate", "7"),
        ("--schedulers", "static"),
        ("--seed", "7"),
        ("--sim", "x"),
        ("--slo", "ttft=2s"),
        ("--workload", "chat"),
    ],
    "selftest": [
        ("--http-client", "raw"),
        ("--itl-ms", "1.5"),
        ("--requests", "7"),
        ("--seconds", "2"),
        ("--server-procs", "7"),
        ("--streams", "1,2"),
        ("--tokens", "7"),
        ("--workers", "1,2"),
    ],
    "serve": [
        ("--api-key", "k"),
        ("--attention-backend", "torch"),
        ("--batch-size", "7"),
        ("--block-size", "7"),
        ("--device", "cuda"),
        ("--drain-timeout", "0.5"),
        ("--dtype", "float16"),
        ("--enable-prefix-caching", None),
        ("--executor", "real"),
        ("--hardware", "a100"),
        ("--host", "127.0.0.2"),
        ("--kv-cache-memory-gb", "1.5"),
        ("--log-level", "info"),
        ("--max-batch-size", "7"),
        ("--max-body-bytes", "7"),
        ("--max-model-len", "7"),
        ("--max-num-batched-tokens", "7"),
        ("--max-num-seqs", "7"),
        ("--max-prefills-per-step", "7"),
        ("--max-queue-delay", "0.02"),
        ("--max-queue-wait", "7"),
        ("--max-waiting", "7"),
        ("--model", "tiny"),
        ("--no-enable-chunked-prefill", None),
        ("--num-kv-blocks", "7"),
        ("--policy", "fcfs"),
        ("--port", "7"),
        ("--preferred-batch-sizes", "1,2"),
        ("--scheduler", "static"),
        ("--seed", "7"),
        ("--served-model-name", "m"),
    ],
    "sim": [
        ("--aging-rate", "2.0"),
        ("--batch-size", "7"),
        ("--block-size", "7"),
        ("--device", "cuda"),
        ("--drain-timeout", "0.5"),
        ("--drop-too-long", None),
        ("--dtype", "float16"),
        ("--enable-prefix-caching", None),
        ("--executor", "real"),
        ("--hardware", "a100"),
        ("--kv-cache-memory-gb", "1.5"),
        ("--max-batch-size", "7"),
        ("--max-model-len", "7"),
        ("--max-num-batched-tokens", "7"),
        ("--max-num-seqs", "7"),
        ("--max-prefills-per-step", "7"),
        ("--max-queue-delay", "0.02"),
        ("--max-queue-size", "7"),
        ("--max-queue-wait", "7"),
        ("--model", "tiny"),
        ("--no-chunked-prefill", None),
        ("--num-kv-blocks", "7"),
        ("--num-requests", "7"),
        ("--out", "o"),
        ("--policy", "fcfs"),
        ("--preferred-batch-sizes", "1,2"),
        ("--rate", "7"),
        ("--scheduler", "static"),
        ("--seed", "7"),
        ("--timeline", None),
        ("--workload", "chat"),
    ],
    "sweep": [
        ("--api-key", "k"),
        ("--auto", None),
        ("--base-url", "http://127.0.0.1:9"),
        ("--between", "7"),
        ("--concurrency", "7"),
        ("--endpoint", "completions"),
        ("--gpus", "0"),
        ("--level-timeout", "60"),
        ("--max-levels", "7"),
        ("--metrics-interval", "0.5"),
        ("--metrics-url", "http://127.0.0.1:9/metrics"),
        ("--model", "tiny"),
        ("--no-gpu-metrics", None),
        ("--no-live", None),
        ("--no-server-metrics", None),
        ("--num-requests", "7"),
        ("--out", "o"),
        ("--rates", "1,2"),
        ("--seed", "7"),
        ("--slo", "ttft=2s"),
        ("--timeout", "30"),
        ("--warmup", "7"),
        ("--workload", "chat"),
    ],
    "version": [],
    "workload": [],
}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", sorted(OLD_FLAGS))
def test_every_old_flag_still_parses(command: str) -> None:
    sub = _subparsers()
    assert command in sub, f"command {command} is gone"
    parser = sub[command]
    samples = dict(OLD_FLAGS[command])
    # required flags (bench's --base-url) go with every other
    required = {
        f: samples[f]
        for a in parser._actions
        if a.required and a.option_strings
        for f in a.option_strings
        if f in samples
    }
    groups = [
        {f for a in g._group_actions for f in a.option_strings}
        for g in parser._mutually_exclusive_groups
    ]
    for flag, value in OLD_FLAGS[command]:
        action = parser._option_string_actions.get(flag)
        assert action is not None, f"cbbench {command} {flag}: no longer accepted"
        argv = list(BASE_ARGV.get(command, []))
        either = EITHER.get(command, [])
        if either and not any(flag in g and either[0] in g for g in groups):
            argv += either
        for f, v in required.items():
            argv += [f, v] if f != flag else []
        argv += [flag] + ([] if value is None else [value])
        ns = parser.parse_args(argv)
        got = getattr(ns, action.dest)
        if value is None:
            assert got is not None and got != action.default or isinstance(got, bool), (
                f"cbbench {command} {flag}: the switch sets nothing"
            )
        else:
            assert got is not None, f"cbbench {command} {flag} {value}: value not kept"


def test_calibrate_grid_flags_run_the_grid_method(tmp_path) -> None:
    """The first calibrate's grid flags still work end to end: they time runner steps over
    the grid given and save a fitted hardware JSON that names the grid method."""
    out = tmp_path / "fit.json"
    argv = ["calibrate", "--model", "tiny", "--device", "cpu", "--batch-sizes", "1,2",
            "--context-lens", "16,32", "--prefill-lens", "16,48", "--repeats", "1",
            "--min-time", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    spec = json.loads(out.read_text())
    assert spec["fit"]["points"] == 2 * 2 + 2
    assert spec["fit"]["method"].startswith("grid")
    assert spec["fit"]["device"] == "cpu"
    assert set(spec["linear"]) and all(v >= 0 for v in spec["linear"].values())
    # the fit table's step-time sums are in ms: a tiny model's steps read "0.00" in seconds
    rows = [ln.split("|") for ln in (tmp_path / "fit.md").read_text().splitlines()
            if ln.startswith("| all ")]  # fmt: skip
    assert "measured (ms)" in (tmp_path / "fit.md").read_text()
    assert len(rows) == 1 and float(rows[0][3].replace(",", "")) > 0, rows


def test_calibrate_grid_flag_rejects_bad_list(capsys) -> None:
    assert main(["calibrate", "--model", "tiny", "--batch-sizes", "1,x"]) == 2
    err = capsys.readouterr().err
    assert "--batch-sizes" in err and "Traceback" not in err


# Issue 51: one spelling per concept. (command, argv with the old spelling, the new flag it
# is the old spelling of, the parsed dest and the value it must hold)
RENAMED = [
    ("route", ["route", "--replica", "http://127.0.0.1:9", "--policy", "round-robin"],
     "--router", "router_policy", "round-robin"),
    # sweep's and plan's --goodput now means SLO targets, as bench's (tests/test_one_spelling.py)
    ("gate", ["gate", "--baseline", "a", "--candidate", "b", "--policy", "p.toml"],
     "--policy-file", "policy", "p.toml"),
    ("report", ["report", "r", "-o", "x.html"], "--out", "output", "x.html"),
    ("report", ["report", "r", "--output", "x.html"], "--out", "output", "x.html"),
    ("run", ["run", "--scheduler", "static,continuous"], "--schedulers", "scheduler",
     "static,continuous"),
    ("sim", ["sim", "--scheduler", "static"], "--schedulers", "scheduler", "static"),
    # a coefficient of variation of 2 is the gamma shape 1/4
    ("workload", ["workload", "show", "chat", "--cv", "2"], "--burstiness", "burstiness", 0.25),
]  # fmt: skip


@pytest.mark.parametrize(("command", "argv", "new", "dest", "value"), RENAMED)
def test_old_spellings_parse_and_say_they_are_old(command, argv, new, dest, value) -> None:
    from cbbench.harness.cli.parsing import old_spelling_notes

    ns = build_parser().parse_args(argv)
    assert getattr(ns, dest) == value
    old = argv[argv.index(new) if new in argv else -2]
    notes = old_spelling_notes(f"cbbench {command}", argv)
    assert notes == [
        f"cbbench {command}: note: {old} is the old spelling of {new} (still accepted)"
    ]
    assert old_spelling_notes(f"cbbench {command}", [a if a != old else new for a in argv]) == []


def test_old_spelling_note_is_printed_once_on_stderr(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cbbench.harness.cli", "workload", "show", "chat", "--arrival",
         "gamma", "--rate", "4", "--cv", "2", "--num-requests", "50", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    note = "cbbench workload: note: --cv is the old spelling of --burstiness (still accepted)"
    assert proc.stderr.strip() == note
    new = subprocess.run(
        [sys.executable, "-m", "cbbench.harness.cli", "workload", "show", "chat", "--arrival",
         "gamma", "--rate", "4", "--burstiness", "0.25", "--num-requests", "50", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert new.stdout == proc.stdout and new.stderr == ""  # the same arrivals


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--port", "x"], "cbbench serve: error: argument --port: invalid int value: 'x'"),
        (["bench", "--base-url", "http://127.0.0.1:9", "--concurrency", "many"],
         "cbbench bench: error: argument --concurrency"),
        (["run", "--schedulers", "static,foo"], "cbbench run: error: --schedulers: unknown foo"),
        (["serve", "--max-queue-delay", "soon"], "expected a duration such as 50ms"),
        (["--no-such-flag"], "cbbench: error: unrecognized arguments: --no-such-flag"),
        # an unknown flag of a command is named by that command (and its --help), not cbbench
        (["report", "x", "--format", "md"],
         "cbbench report: error: unrecognized arguments: --format md"),
    ],
)  # fmt: skip
def test_errors_are_one_line_and_a_hint(argv, message) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cbbench.harness.cli", *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 2 and message in lines[0], proc.stderr
    assert "usage:" not in proc.stderr and "Traceback" not in proc.stderr


def test_durations_take_units_and_a_setting_of_another_scheduler_is_said(tmp_path) -> None:
    from cbbench.reference_engine.config.options import inapplicable

    sub = _subparsers()
    for text, seconds in (("50ms", 0.05), ("0.05s", 0.05), ("0.05", 0.05), ("1m", 60.0)):
        ns = sub["serve"].parse_args(["--max-queue-delay", text])
        assert ns.max_queue_delay == pytest.approx(seconds)
    # every duration flag takes units; a bare number keeps its old meaning, seconds
    for argv, dest, seconds in (
        (["bench", "--base-url", "x", "--timeout", "10m"], "timeout", 600.0),
        (["bench", "--base-url", "x", "--timeout", "30"], "timeout", 30.0),
        (["route", "--replica", "x", "--poll-interval", "250ms"], "poll_interval", 0.25),
        (["probe", "--base-url", "http://x", "--max-time", "2m"], "max_time", 120.0),
        (["sweep", "--base-url", "x", "--rates", "1", "--out", "o", "--level-timeout", "90s"],
         "level_timeout", 90.0),
    ):  # fmt: skip
        assert getattr(build_parser().parse_args(argv), dest) == pytest.approx(seconds), argv
    said = inapplicable({"max_queue_delay": 0.05, "batch_size": 4}, ["continuous"])
    assert said == [
        "--max-queue-delay is a dynamic scheduler setting: it does not apply to --scheduler "
        "continuous"
    ]
    assert inapplicable({"max_queue_delay": 0.05}, ["dynamic"]) == []
    # the real command says it as it starts, and says a simulated model is one (it announced
    # "8030.3M params, float32, cpu" as if llama-3-8b's weights were loaded)
    from tests.process_support import kill, readline_within

    log = tmp_path / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cbbench.harness.cli", "serve", "--executor", "sim",
             "--model", "llama-3-8b", "--max-queue-delay", "50ms", "--port", "0",
             "--no-engine-process"],
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
        try:
            assert "ready at http://127.0.0.1:" in readline_within(proc, 120, "cbbench serve")
        finally:
            kill(proc)
    said = log.read_text()
    assert "warning: --max-queue-delay is a dynamic scheduler setting" in said
    assert "llama-3-8b (SIMULATED, no weights loaded: 8030.3M-parameter shape" in said
    assert "float32, cpu" not in said


def test_one_slo_grammar_for_bench_and_plan() -> None:
    from cbbench.harness.planning.space import Slo, parse_slos
    from cbbench.harness.results.summary import parse_slo

    text = "ttft=500ms,tpot_p99=50ms"
    assert parse_slo(text) == {"ttft": 0.5, "tpot": 0.05}  # goodput: each request within
    assert parse_slos(text) == [Slo("ttft", "max", 0.5), Slo("tpot", "p99", 0.05)]
    from cbbench.harness.errors import CbbenchError

    for bad in ("ttft=500", "latency=1s", "ttft_p42=1s"):
        with pytest.raises(CbbenchError) as a:
            parse_slo(bad)
        with pytest.raises(CbbenchError) as b:
            parse_slos(bad)
        assert str(a.value) == str(b.value)  # the same words on every command


def test_merge_takes_out_as_every_command_does(tmp_path) -> None:
    """`merge --out OUT DIR...`; the old `merge OUT DIR...` still works and says it is old."""
    cli = [sys.executable, "-m", "cbbench.harness.cli", "merge"]
    new = subprocess.run([*cli, "--out", str(tmp_path / "m"), str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    old = subprocess.run([*cli, str(tmp_path / "m"), str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert new.returncode == old.returncode == 2
    assert "note" not in new.stderr and "nope" in new.stderr.splitlines()[-1]
    assert old.stderr.splitlines()[0] == (
        "cbbench merge: note: `merge OUT DIR...` is the old form of `merge --out OUT DIR...` "
        "(still accepted)"
    )
    assert old.stderr.splitlines()[-1] == new.stderr.splitlines()[-1]
