"""Every flag of the command-line parsers as they were before the options layer (commit
d438e77: harness/cmd_*.py, reference_engine/cmd_serve.py and cmd_calibrate.py) is still
accepted by today's `cbbench` (issue 13: "every existing CLI flag still works").

OLD_FLAGS is data: each command's old flags with a value its old parser took (None: a
switch). Parsing `cbbench CMD FLAG [VALUE]` must succeed and set the flag's destination.
"""

from __future__ import annotations

import argparse
import json

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


def test_calibrate_grid_flag_rejects_bad_list(capsys) -> None:
    assert main(["calibrate", "--model", "tiny", "--batch-sizes", "1,x"]) == 2
    err = capsys.readouterr().err
    assert "--batch-sizes" in err and "Traceback" not in err
