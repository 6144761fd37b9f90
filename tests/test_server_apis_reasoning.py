"""`cbbench serve --reasoning-parser` on /v1/responses and /v1/messages: the reasoning part of
each output as a Responses reasoning item and an Anthropic thinking block, read by the official
clients (`openai`, `anthropic`) over real HTTP on 127.0.0.1; the same split, token for token,
as the chat endpoint's; the request levers (`reasoning.effort`, `thinking`) on the same rule;
and `cbbench bench --endpoint responses|messages` against it reports TTFO after TTFT and the
server's reasoning-token count."""

from __future__ import annotations

import io

import anthropic
import openai
import pytest
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.core.outputs import RequestMetrics, RequestOutput
from cbbench.reference_engine.model.tokenizer import ByteTokenizer
from cbbench.reference_engine.server.messages_api import MessagesRequest, MessagesShaper
from cbbench.reference_engine.server.reasoning import ReasoningOptions, ReasoningSplit
from cbbench.reference_engine.server.responses_api import ResponsesRequest, ResponsesShaper
from cbbench.reference_engine.server.serving import Generation
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.server_support import serve

CONFIG = EngineConfig(model="tiny", scheduler="continuous", max_model_len=256)
CONVERSATION = [{"role": "user", "content": "Why is the sky blue?"}]
N = 16  # output tokens; the rule's share 0.5 makes the first 8 reasoning
EXT = {"ignore_eos": True, "return_token_ids": True}
ANT = {"temperature": 0, **EXT}  # greedy (through extra_body, as tests/test_server_apis.py)


@pytest.fixture(scope="module")
def server():
    with serve(CONFIG, reasoning=ReasoningOptions("deepseek_r1", "reasoning", 0.5)) as (u, _):
        yield u


def _oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _ant(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


def _chat(url: str, **extra):
    r = _oai(url).chat.completions.create(
        model="tiny", messages=CONVERSATION, max_tokens=N, temperature=0,
        extra_body={**EXT, **extra},
    )  # fmt: skip
    return r.choices[0].message, r.usage.completion_tokens_details.reasoning_tokens


def _responses(url: str, **kw):
    return _oai(url).responses.create(
        model="tiny", input=CONVERSATION, max_output_tokens=N, temperature=0, extra_body=EXT, **kw
    )


def test_responses_stream_reasoning_item_then_message(server):
    chat, chat_r = _chat(server)
    assert chat_r == 8
    kinds, items = [], []
    with _oai(server).responses.stream(
        model="tiny", input=CONVERSATION, max_output_tokens=N, temperature=0, extra_body=EXT
    ) as stream:
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "response.output_item.added":
                items.append(ev.item.type)
        final = stream.get_final_response()
    assert items == ["reasoning", "message"]
    # every reasoning delta before the message item opens, every answer delta after it
    first_answer = kinds.index("response.output_text.delta")
    last_reasoning = len(kinds) - 1 - kinds[::-1].index("response.reasoning_text.delta")
    assert last_reasoning < kinds.index("response.output_item.added", 3) < first_answer
    # one token per engine step, so one delta each (the SDK drops the answer's token_ids)
    assert kinds.count("response.reasoning_text.delta") == 8
    assert kinds.count("response.output_text.delta") == 8
    assert final.usage.output_tokens == N
    assert final.usage.output_tokens_details.reasoning_tokens == 8
    reasoning, message = final.output
    assert (
        reasoning.type == "reasoning" and reasoning.content[0].text == chat.model_extra["reasoning"]
    )
    assert final.output_text == chat.content  # greedy: the chat endpoint's answer
    body = _responses(server)
    assert [i.type for i in body.output] == ["reasoning", "message"]
    assert body.output[0].content[0].text == chat.model_extra["reasoning"]
    assert body.output_text == chat.content
    assert body.usage.output_tokens_details.reasoning_tokens == 8


def test_messages_stream_thinking_block_then_text(server):
    chat, _ = _chat(server)
    c = _ant(server)
    blocks, deltas = [], []
    with c.messages.stream(model="tiny", messages=CONVERSATION, max_tokens=N, extra_body=ANT) as s:
        for ev in s:
            if ev.type == "content_block_start":
                blocks.append((ev.index, ev.content_block.type))
            elif ev.type == "content_block_delta":
                deltas.append((ev.index, ev.delta.type, len(ev.model_extra["token_ids"])))
        final = s.get_final_message()
    assert blocks == [(0, "thinking"), (1, "text")]
    assert sum(n for i, t, n in deltas if (i, t) == (0, "thinking_delta")) == 8
    assert sum(n for i, t, n in deltas if (i, t) == (1, "text_delta")) == 8
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == chat.model_extra["reasoning"]
    assert final.content[1].text == chat.content and final.usage.output_tokens == N
    body = c.messages.create(model="tiny", messages=CONVERSATION, max_tokens=N, extra_body=ANT)
    assert [b.type for b in body.content] == ["thinking", "text"]
    assert body.content[0].thinking == chat.model_extra["reasoning"]
    assert body.content[1].text == chat.content


def test_effort_and_thinking_levers_map_onto_the_split_rule(server):
    _, high = _chat(server, reasoning_effort="high")
    assert high == 12
    r = _responses(server, reasoning={"effort": "high"})
    assert r.usage.output_tokens_details.reasoning_tokens == 12
    assert (
        _responses(server, reasoning={"effort": "low"}).usage.output_tokens_details.reasoning_tokens
        == 4
    )
    c = _ant(server)
    off = c.messages.create(model="tiny", messages=CONVERSATION, max_tokens=N, extra_body=ANT,
                            thinking={"type": "disabled"})  # fmt: skip
    assert [b.type for b in off.content] == ["text"]
    with c.messages.stream(model="tiny", messages=CONVERSATION, max_tokens=N, extra_body=ANT,
                           thinking={"type": "enabled", "budget_tokens": 3}) as s:  # fmt: skip
        thinking_ids = [len(ev.model_extra["token_ids"]) for ev in s
                        if ev.type == "content_block_delta" and ev.delta.type == "thinking_delta"]  # fmt: skip
        capped = s.get_final_message()
    assert sum(thinking_ids) == 3  # the cap, under the rule's 8
    chat_off, _ = _chat(server, chat_template_kwargs={"enable_thinking": False})
    assert off.content[0].text == chat_off.content
    assert [b.type for b in capped.content] == ["thinking", "text"]
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="tiny", messages=CONVERSATION, max_tokens=N,
                          thinking={"type": "sometimes"})  # fmt: skip
    assert e.value.body["type"] == "error" and "thinking" in e.value.body["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="reasoning"):
        _responses(server, reasoning={"effort": "extreme"})


def _generation(budget: int):
    """A Generation over the byte tokenizer whose split has `budget` reasoning tokens."""
    tok = ByteTokenizer(512, None, (2,))
    split = ReasoningSplit(budget, "reasoning")
    gen = Generation("resp-abc", [5, 6], tok.new_detokenizer(), reasoning=split)
    return tok, gen


def _out(tok, text: str, n: int, finished: bool = False) -> RequestOutput:
    ids = tok.encode(text)
    return RequestOutput("r", ids, 2, n, finished, "stop" if finished else None,
                         RequestMetrics(arrival_time=0.0))  # fmt: skip


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_shapers_split_a_crossing_delta_and_close_an_output_ended_while_thinking(api):
    body = (ResponsesRequest(input="hi", max_output_tokens=8) if api == "responses"
            else MessagesRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=8))  # fmt: skip
    shaper_cls = ResponsesShaper if api == "responses" else MessagesShaper
    # a delta of two tokens across the boundary (as a speculative step brings): two events
    tok, gen = _generation(3)
    shaper = shaper_cls(gen, "tiny", body)
    evs = shaper.start()
    evs += shaper.events(gen.on_output(_out(tok, "ab", 2)))
    evs += shaper.events(gen.on_output(_out(tok, "cd", 4)))
    evs += shaper.events(gen.on_output(_out(tok, "e", 5, finished=True)))
    evs += shaper.end()
    if api == "responses":
        deltas = [(e["type"].split(".")[1], e["delta"]) for e in evs if e["type"].endswith("delta")]
        assert deltas == [("reasoning_text", "ab"), ("reasoning_text", "c"),
                          ("output_text", "d"), ("output_text", "e")]  # fmt: skip
        body_out = shaper.final_body()["output"]
        assert body_out[0]["content"][0]["text"] == "abc"
        assert body_out[1]["content"][0]["text"] == "de"
    else:
        deltas = [
            (e["index"], e["delta"]["type"]) for e in evs if e["type"] == "content_block_delta"
        ]
        assert deltas == [(0, "thinking_delta"), (0, "thinking_delta"),
                          (1, "text_delta"), (1, "text_delta")]  # fmt: skip
        content = shaper.final_body()["content"]
        assert content[0]["thinking"] == "abc" and content[1]["text"] == "de"
    # an output that ends (EOS) inside its reasoning: the answer item/block still opens, empty
    tok, gen = _generation(5)
    shaper = shaper_cls(gen, "tiny", body)
    evs = shaper.start() + shaper.events(gen.on_output(_out(tok, "ab", 2, finished=True)))
    evs += shaper.end()
    kinds = [e["type"] for e in evs]
    if api == "responses":
        added = [e["item"]["type"] for e in evs if e["type"] == "response.output_item.added"]
        done = [e["item"]["type"] for e in evs if e["type"] == "response.output_item.done"]
        assert added == done == ["reasoning", "message"]
        assert evs[-1]["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == 2
    else:
        assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
        assert [b["type"] for b in shaper.final_body()["content"]] == ["thinking", "text"]


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_bench_reports_ttfo_and_the_servers_reasoning_tokens(server, tmp_path, endpoint):
    wl = Workload("t", 0, tuple(RequestSpec(i, 8, 24, None) for i in range(4)))
    cfg = BenchConfig(base_url=server, workload=wl, endpoint=endpoint, concurrency=2,
                      out_dir=tmp_path / "run", live=False)  # fmt: skip
    res = run_bench(cfg, console=Console(file=io.StringIO(), width=200))
    for r in res.records:
        assert r.ok, r.error
        assert r.reasoning_tokens == 12 and r.output_tokens_client == 24, r
        assert r.token_mismatch is None and r.answer_tpot_s is not None
        # the first answer token is the 13th: TTFO is its arrival, after the first token's
        assert r.ttfo_s == pytest.approx(r.token_times_s[12] - r.sent_s)
        assert r.ttfo_s >= r.ttft_s  # >=: on a busy host one read may bring both
    assert any(r.ttfo_s > r.ttft_s for r in res.records)


@pytest.fixture(scope="module")
def reasoning_serve():
    """One `cbbench serve --reasoning-parser deepseek_r1` (its own process, engine process on)
    for both endpoints below: each run reads only its own records."""
    from cbbench.harness.servers.launcher import launch_reference_server

    flags = ["--reasoning-parser", "deepseek_r1"]
    with launch_reference_server("tiny", "continuous", "cpu", flags) as srv:
        yield srv


@pytest.mark.serial  # TTFO > TTFT needs the answer in a later read than the first token:
# 16 tiny tokens take ~11 ms, and a worker stalled beside the parallel phase read all in one
@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_cbbench_bench_cli_against_cbbench_serve(reasoning_serve, tmp_path, endpoint):
    """As a user runs them: `cbbench serve --reasoning-parser deepseek_r1` (its own process,
    engine process on) and `cbbench bench --endpoint responses|messages`: the run folder's
    records hold TTFO after TTFT and the server's reasoning tokens (half of 16)."""
    from cbbench.harness.cli import main
    from cbbench.harness.results.run_folder import load_run

    out = tmp_path / "run"
    code = main(["bench", "--base-url", reasoning_serve.base_url, "--endpoint", endpoint,
                 "--workload", "prompt=12,output=16", "--num-requests", "4",
                 "--concurrency", "2", "--out", str(out), "--no-live"])  # fmt: skip
    assert code == 0
    recs = load_run(out).records
    assert len(recs) == 4
    for r in recs:
        assert r.ok and r.reasoning_tokens == 8 and r.output_tokens_client == 16, r
        assert r.ttfo_s >= r.ttft_s > 0
    assert any(r.ttfo_s > r.ttft_s for r in recs)
