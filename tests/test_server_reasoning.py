"""`cbbench serve --reasoning-parser`: the reference engine streams the first part of each
chat output as reasoning (reference_engine/server/reasoning.py), read by the official `openai`
client, with usage details; `cbbench bench` against it reports TTFO, and the report shows it."""

from __future__ import annotations

import io
import subprocess
import sys

import openai
import pytest
from cbbench.harness.cli import main
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.reasoning import ReasoningOptions, ReasoningSplit, budget
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.server_support import serve

CONFIG = EngineConfig(model="tiny", scheduler="continuous", max_model_len=256)
MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module", params=["reasoning", "reasoning_content", "content"])
def server(request):
    opts = ReasoningOptions("deepseek_r1", request.param, 0.5)
    with serve(CONFIG, reasoning=opts) as (url, _stack):
        yield request.param, url


def _ask(url: str, stream: bool, **extra):
    return _client(url).chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        stream=stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
        extra_body={"return_token_ids": True, "ignore_eos": True, **extra},
    )


def test_openai_client_reads_reasoning_then_answer(server):
    field, url = server
    full = _ask(url, False)
    msg = full.choices[0].message
    assert full.usage.completion_tokens == 16
    assert full.usage.completion_tokens_details.reasoning_tokens == 8
    chunks = list(_ask(url, True))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 8
    kinds, ids = [], []
    for ch in chunks[:-1]:
        d = ch.choices[0].delta
        think = field != "content" and (d.model_extra or {}).get(field) is not None
        kinds.append("r" if think else "a")  # a token may decode to "" (partial UTF-8)
        ids += ch.choices[0].token_ids
    # greedy: the stream repeats the non-streaming output token for token
    assert ids == full.choices[0].token_ids
    if field == "content":  # inline tags: the first 8 tokens inside <think> ... </think>
        assert msg.content.startswith("<think>") and msg.content.count("</think>") == 1
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1])
        assert text == msg.content
    else:
        assert kinds == ["r"] * 8 + ["a"] * 8
        assert (msg.model_extra or {}).get(field) and isinstance(msg.content, str)
        assert "<think>" not in msg.content


def test_request_levers_effort_and_enable_thinking(server):
    _, url = server
    assert (
        _ask(url, False, reasoning_effort="high").usage.completion_tokens_details.reasoning_tokens
        == 12
    )
    off = _ask(url, False, chat_template_kwargs={"enable_thinking": False})
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    assert "<think>" not in off.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        _ask(url, False, chat_template_kwargs={"enable_thinking": "yes"})
    assert "enable_thinking" in str(err.value)


def test_split_rule():
    opts = ReasoningOptions("qwen3", "reasoning", 0.5)
    assert budget(opts, 16, None, True) == 8 and budget(opts, 16, "low", True) == 4
    assert budget(opts, 16, None, False) == 0 and budget(opts, 1, None, True) == 0
    assert budget(ReasoningOptions("qwen3", "reasoning", 1.0), 16, "high", True) == 15
    assert budget(ReasoningOptions(), 16, None, True) == 0  # no parser: no reasoning
    s = ReasoningSplit(3, "reasoning")
    assert s.parts("ab", 2) == [("reasoning", "ab", 2)]
    assert s.parts("cdef", 4) == [("reasoning", "c", 1), ("content", "def", 3)]
    assert s.message() == {"reasoning": "abc", "content": "def"} and s.reasoning_tokens == 3


@pytest.mark.parametrize(("field", "parser"), [("reasoning", "auto"), ("content", "think-tags")])
def test_bench_reports_ttfo_and_the_report_shows_it(tmp_path, field, parser):
    opts = ReasoningOptions("deepseek_r1", field, 0.5)
    wl = Workload("t", 0, tuple(RequestSpec(i, 8, 24, None) for i in range(4)))
    with serve(CONFIG, reasoning=opts) as (url, _stack):
        cfg = BenchConfig(
            base_url=url, workload=wl, endpoint="chat", concurrency=2,
            out_dir=tmp_path / "run", live=False, reasoning_parser=parser,
        )  # fmt: skip
        out = io.StringIO()
        res = run_bench(cfg, console=Console(file=out, width=200))
    for r in res.records:
        assert r.ok and r.reasoning_tokens == 12 and r.output_tokens_client == 24, r
        # >=: on a busy host one read may bring the first tokens together (spread: same time)
        assert r.ttfo_s >= r.ttft_s and r.answer_tpot_s is not None and r.stream_flags == []
        assert r.token_mismatch is None  # the streamed count agrees with usage's
        # the first answer token is the 13th: TTFO is its arrival
        assert r.ttfo_s == pytest.approx(r.token_times_s[12] - r.sent_s)
    text = out.getvalue()
    assert "TTFO (ms)" in text and "reasoning: 48 tokens, 50.0% of output" in text
    html = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "run"), "--out", str(html)]) == 0
    page = html.read_text()
    assert "CDF of TTFO" in page and "reasoning share" in page


def test_bad_reasoning_flags_are_one_line():
    cli = [sys.executable, "-m", "cbbench.harness.cli", "serve", "--model", "tiny", "--port", "0"]
    for flags, what in (
        (["--reasoning-share", "2"], "--reasoning-share"),
        (["--reasoning-parser", "nope"], "--reasoning-parser"),
    ):
        p = subprocess.run([*cli, *flags], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and what in p.stderr and "Traceback" not in p.stderr


def test_cbbench_serve_process_with_reasoning_content():
    """`cbbench serve` as a user starts it (its own process, engine process on): the flags
    reach the app; the openai client reads `reasoning_content` and the usage details."""
    from cbbench.harness.servers.launcher import launch_reference_server

    flags = ["--reasoning-parser", "qwen3", "--reasoning-field", "reasoning_content"]
    with launch_reference_server("tiny", "continuous", "cpu", flags) as srv:
        chunks = list(_ask(srv.base_url, True))
        full = _ask(srv.base_url, False, chat_template_kwargs={"enable_thinking": False})
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 8
    kinds = ["r" if (c.choices[0].delta.model_extra or {}).get("reasoning_content") is not None
             else "a" for c in chunks[:-1]]  # fmt: skip
    assert kinds == ["r"] * 8 + ["a"] * 8
    assert full.usage.completion_tokens_details.reasoning_tokens == 0
