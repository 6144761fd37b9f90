"""Reasoning tokens of a whole (non-streamed) Messages response: `cbbench serve
--reasoning-parser` puts each content block's own `token_ids` in the body when asked (the
thinking block's, then the text's), and the harness counts the thinking block's as it counts
a stream's thinking deltas, so streamed and whole responses to the same requests report the
same reasoning tokens (Responses' whole body: the server's `reasoning_tokens`). Real server
on 127.0.0.1, the official anthropic client, `cbbench bench`'s runner."""

from __future__ import annotations

import io

import anthropic
import pytest
from cbbench.harness.client import messages
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.reasoning import ReasoningOptions
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.server_support import serve

CONFIG = EngineConfig(model="tiny", scheduler="continuous", max_model_len=256)
CONVERSATION = [{"role": "user", "content": "Why is the sky blue?"}]
N = 16  # output tokens; the rule's share 0.5 makes the first 8 reasoning


@pytest.fixture(scope="module")
def server():
    with serve(CONFIG, reasoning=ReasoningOptions("deepseek_r1", "reasoning", 0.5)) as (u, _):
        yield u


def _records(url: str, endpoint: str, stream: bool, out) -> list:
    wl = Workload("t", 0, tuple(RequestSpec(i, 8, N, None) for i in range(3)))
    cfg = BenchConfig(base_url=url, workload=wl, endpoint=endpoint, concurrency=1,
                      stream=stream, out_dir=out, live=False)  # fmt: skip
    return run_bench(cfg, console=Console(file=io.StringIO(), width=200)).records


@pytest.mark.parametrize("endpoint", ["messages", "responses"])
def test_whole_responses_report_the_reasoning_tokens_the_stream_does(server, tmp_path, endpoint):
    streamed = _records(server, endpoint, True, tmp_path / "stream")
    whole = _records(server, endpoint, False, tmp_path / "whole")
    for r in streamed + whole:
        assert r.ok, r.error
        assert r.reasoning_tokens == 8 and r.output_tokens_client == N, r
        assert r.token_mismatch is None and not r.stream_flags
    assert [r.reasoning_tokens for r in whole] == [r.reasoning_tokens for r in streamed]


def test_the_body_splits_the_outputs_ids_between_its_blocks_as_the_stream_does(server):
    c = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0, timeout=60)
    kw = {"model": "tiny", "messages": CONVERSATION, "max_tokens": N}
    ext = {"temperature": 0, "ignore_eos": True, "return_token_ids": True}
    body = c.messages.create(**kw, extra_body=ext).model_dump()
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    think_ids, text_ids = (b["token_ids"] for b in body["content"])
    assert len(think_ids) == 8 and len(text_ids) == N - 8
    streamed: dict[int, list[int]] = {0: [], 1: []}
    with c.messages.stream(**kw, extra_body=ext) as s:
        for ev in s:
            if ev.type == "content_block_delta":
                streamed[ev.index] += ev.model_dump()["token_ids"]
    assert streamed == {0: think_ids, 1: text_ids}  # greedy: the same tokens, the same split
    plain = c.messages.create(**kw, extra_body={"temperature": 0, "ignore_eos": True})
    assert all("token_ids" not in b.model_dump() for b in plain.content)  # only when asked


def _whole(blocks: list[dict]) -> dict:
    obj = {"type": "message", "content": blocks, "stop_reason": "max_tokens",
           "usage": {"input_tokens": 3, "output_tokens": 5}}  # fmt: skip
    return messages.body(obj, {})


def test_the_adapter_counts_thinking_ids_and_leaves_an_unknown_count_unknown():
    out = _whole([
        {"type": "thinking", "thinking": "hm", "token_ids": [1, 2, 3]},
        {"type": "text", "text": "ok", "token_ids": [4, 5]},
    ])  # fmt: skip
    assert out["choices"][0]["token_ids"] == [1, 2, 3, 4, 5]
    assert out["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    no_ids = _whole([{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok"}])
    assert "token_ids" not in no_ids["choices"][0]
    assert "completion_tokens_details" not in no_ids["usage"]  # no count, not a guessed one
    partial = _whole([
        {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok", "token_ids": [4]},
    ])  # fmt: skip
    assert "token_ids" not in partial["choices"][0]
    answer_only = _whole([{"type": "text", "text": "ok", "token_ids": [4, 5]}])
    assert "completion_tokens_details" not in answer_only["usage"]
