"""Reasoning flags of `cbbench bench` / `sweep`: --reasoning-effort and --chat-template-kwargs
passed through into chat bodies, max_completion_tokens on chat as OpenAI spells it, and bad
input as one line with exit 2."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from cbbench.harness.cli import bench, sweep
from cbbench.harness.client.api import ClientConfig, build_payload
from cbbench.harness.results.records import RequestRecord

CLI = [sys.executable, "-m", "cbbench.harness.cli"]


def _parse(register, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd"))
    return p.parse_args(argv)


def test_bench_flags_reach_the_chat_body():
    args = _parse(bench.register, [
        "bench", "--base-url", "http://127.0.0.1:9", "--endpoint", "chat", "--workload",
        "seed-demo", "--reasoning-effort", "high", "--chat-template-kwargs",
        '{"enable_thinking": false}', "--reasoning-parser", "think-tags",
        "--extra-body", '{"reasoning_effort": "low"}',
    ])  # fmt: skip
    cfg = bench.config_from_args(args)
    assert cfg.reasoning_parser == "think-tags"
    # --extra-body is merged last: it wins over the named flags
    assert cfg.extra_body == {
        "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False},
    }
    client = ClientConfig("http://x", "m", endpoint="chat", extra_body=cfg.extra_body)
    body = build_payload(client, "hi", RequestRecord(id="c", index=0, prompt_len=1, output_len=7))
    assert body["max_completion_tokens"] == 7 and body["max_tokens"] == 7
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    plain = build_payload(ClientConfig("http://x", "m"), [1], RequestRecord("c", 0, 1, 7))
    assert "max_completion_tokens" not in plain  # completions: max_tokens only


def test_sweep_takes_the_same_flags():
    args = _parse(sweep.register, [
        "sweep", "--base-url", "http://127.0.0.1:9", "--out", "x", "--rates", "1",
        "--endpoint", "chat", "--reasoning-effort", "low", "--reasoning-parser", "none",
    ])  # fmt: skip
    opts = sweep.sweep_options(args)
    assert opts.client.reasoning_parser == "none"
    assert opts.client.extra_body == {"reasoning_effort": "low"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--endpoint", "chat", "--chat-template-kwargs", "[1]"], "--chat-template-kwargs"),
        (["--endpoint", "chat", "--chat-template-kwargs", "{no"], "--chat-template-kwargs"),
        (["--reasoning-effort", "high"], "--reasoning-effort needs --endpoint chat"),
        (["--reasoning-parser", "magic"], "--reasoning-parser"),
        (["--slo", "ttfo=soon"], "--slo ttfo"),
    ],
)
def test_bad_reasoning_flags_are_one_line(tmp_path, flags, message):
    proc = subprocess.run(
        [*CLI, "bench", "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "r"), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()  # the error, then at most one hint line
    assert proc.returncode == 2 and len(lines) <= 2 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_reasoning_preset_is_long_and_heavy_tailed():
    import numpy as np
    from cbbench.workloads import load_workload

    wl = load_workload("reasoning", seed=0)
    out = np.array([r.output_len for r in wl.requests])
    total = np.array([r.prompt_len + r.output_len for r in wl.requests])
    assert len(wl) == 200 and not wl.open_loop
    assert 700 < np.median(out) < 1400 and np.percentile(out, 90) > 3 * np.median(out)
    assert out.max() <= 7168 and total.max() <= 8192  # fits an 8k context


def test_locust_takes_the_same_flags():
    from cbbench.harness.cli import locust

    args = _parse(locust.register, [
        "locust", "--base-url", "http://127.0.0.1:9", "--workload", "seed-demo",
        "--endpoint", "chat", "--reasoning-parser", "think-tags",
        "--chat-template-kwargs", '{"enable_thinking": true}',
    ])  # fmt: skip
    settings = locust.settings_from_args(args)
    assert settings.reasoning_parser == "think-tags"
    assert settings.extra_body == {"chat_template_kwargs": {"enable_thinking": True}}
