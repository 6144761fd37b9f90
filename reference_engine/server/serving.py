"""One request's journey from engine outputs to OpenAI chunks: detokenization, stop strings,
token counting, and the `cbbench` field.

`Generation` is endpoint-agnostic: it turns each RequestOutput into a `Delta` (text, token
ids, finish reason); `ResponseShaper` wraps deltas in completion or chat shapes. Stop strings end
the request as soon as the decoded text contains one (the text is cut before it, and the
engine request is aborted); while streaming, the last `len(longest stop) - 1` characters are
held back so a stop string split across tokens is never half-sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cbbench.reference_engine.core.outputs import RequestMetrics, RequestOutput, TokenLogprob
from cbbench.reference_engine.model.tokenizer import IncrementalDetokenizer
from cbbench.reference_engine.server import protocol as P
from cbbench.reference_engine.server.disagg import KVHop, decode_phases
from cbbench.reference_engine.server.logprobs import (
    TokenText,
    chat_logprobs,
    completion_logprobs,
)
from cbbench.reference_engine.server.protocol import cbbench_info
from cbbench.reference_engine.server.reasoning import ReasoningSplit


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    finish_reason: str | None  # set on the last delta
    logprobs: list[TokenLogprob] | None = None  # one per token id, when asked for
    parts: list[tuple[str, str, int]] | None = None  # reasoning split: (field, text, tokens)


@dataclass
class Generation:
    request_id: str
    prompt_token_ids: list[int]
    detokenizer: IncrementalDetokenizer
    stop: tuple[str, ...] = ()
    min_tokens: int = 0
    scheduler: str = ""
    text: str = ""  # decoded so far (cut at a stop string)
    sent: int = 0  # characters of `text` already returned in deltas
    token_ids: list[int] = field(default_factory=list)  # generated so far
    finish_reason: str | None = None
    metrics: RequestMetrics | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when the request asked
    reasoning: ReasoningSplit | None = None  # --reasoning-parser: the output's split
    hop: KVHop | None = None  # prefill/decode disaggregation: this request's hop
    kv_transfer: Any = None  # a prefill hop's KVPayload, from its last output
    _scanned: int = 0  # stop strings were searched for in text[:_scanned]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def on_output(self, out: RequestOutput) -> Delta:
        """Apply one engine output. After a stop-string hit the result is finished even if
        the engine is not: the caller aborts the engine request."""
        assert not self.finished, "output after the generation finished"
        self.metrics = out.metrics
        if out.kv_transfer is not None:
            self.kv_transfer = out.kv_transfer
        self.token_ids.extend(out.new_token_ids)
        if out.logprobs is not None:
            self.logprobs.extend(out.logprobs)
        self.text += self.detokenizer.push(out.new_token_ids)
        if out.finished:
            self.text += self.detokenizer.flush()
        if self.stop and len(self.token_ids) >= self.min_tokens and self._cut_at_stop():
            self.finish_reason = "stop"
        elif out.finished:
            self.finish_reason = out.finish_reason or "stop"
        end = len(self.text)
        if not self.finished and self.stop:
            end = max(self.sent, end - (max(map(len, self.stop)) - 1))
        delta = Delta(
            self.text[self.sent : end], list(out.new_token_ids), self.finish_reason, out.logprobs
        )
        self.sent = end
        if self.reasoning is not None:
            delta.parts = self.reasoning.parts(delta.text, len(delta.token_ids))
        return delta

    def _cut_at_stop(self) -> bool:
        longest = max(map(len, self.stop))
        start = max(0, self._scanned - longest + 1)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        self._scanned = len(self.text)
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        self.sent = min(self.sent, len(self.text))
        return True

    def cbbench_field(self) -> dict:
        m = self.metrics
        if self.hop is not None and self.hop.phases:  # a decode hop: the request's phases
            phases = decode_phases(self.hop, m)
            info = cbbench_info(
                queue_time_s=phases.get("prefill_queue_s"),
                scheduler=self.scheduler,
                num_preemptions=m.num_preemptions if m is not None else 0,
                num_cached_tokens=m.num_cached_tokens if m is not None else 0,
            )
            return {**info, "phases": phases}
        return cbbench_info(
            queue_time_s=m.queue_time if m is not None else None,
            scheduler=self.scheduler,
            num_preemptions=m.num_preemptions if m is not None else 0,
            num_cached_tokens=m.num_cached_tokens if m is not None else 0,
            num_draft_tokens=m.num_draft_tokens if m is not None else 0,
            num_accepted_tokens=m.num_accepted_tokens if m is not None else 0,
            prefill_time_s=_span(m.first_scheduled_time, m.first_token_time) if m else None,
            decode_time_s=_span(m.first_token_time, m.finished_time) if m else None,
        )


class ResponseShaper:
    """Wraps a Generation's deltas in completion or chat chunk/body shapes."""

    def __init__(
        self,
        gen: Generation,
        model: str,
        body: P.SamplingFields,
        chat: bool,
        token_text: TokenText | None = None,
        echo: str = "",
    ):
        """`token_text`: id -> its text, for logprobs; `echo`: the prompt text that starts a
        completion's text (`echo: true`)."""
        self.gen = gen
        self.chat = chat
        self.token_text = token_text or str
        self.echo = echo
        self.offset = len(echo)  # completions' text_offset of the next token
        self.body = body
        self.return_token_ids = body.return_token_ids
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.model = model
        self.created = int(time.time())
        self.first = True

    @property
    def wants_logprobs(self) -> bool:
        body = self.body
        return bool(body.logprobs) if self.chat else body.logprobs is not None  # type: ignore[attr-defined]

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any]:
        if self.chat:
            return chat_logprobs(entries, self.token_text)
        body, self.offset = completion_logprobs(entries, self.token_text, self.offset)
        return body

    def _envelope(self, stream: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if stream else "chat.completion"
        else:
            kind = "text_completion"
        return P.envelope(self.gen.request_id, kind, self.model, self.created)

    def _usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = P.usage(len(self.gen.prompt_token_ids), len(self.gen.token_ids))
        m = self.gen.metrics  # vLLM's field for prefix-cache hits
        usage["prompt_tokens_details"] = {"cached_tokens": m.num_cached_tokens if m else 0}
        if self.gen.reasoning is not None:
            r = self.gen.reasoning.reasoning_tokens
            usage["completion_tokens_details"] = {"reasoning_tokens": r}
        return usage

    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        """The chunks of one delta: one, or (reasoning split) one per kind it holds."""
        if delta.parts is None or not self.chat:
            return [self.chunk(delta)]
        out, at = [], 0
        for i, (key, text, k) in enumerate(delta.parts):
            last = i == len(delta.parts) - 1
            part = Delta(
                text,
                delta.token_ids[at : at + k],
                delta.finish_reason if last else None,
                None if delta.logprobs is None else delta.logprobs[at : at + k],
            )
            out.append(self.chunk(part, key))
            at += k
        return out

    def chunk(self, delta: Delta, key: str = "content") -> dict[str, Any]:
        ids = delta.token_ids if self.return_token_ids else None
        prompt_ids = self.gen.prompt_token_ids if self.return_token_ids and self.first else None
        if self.chat:
            d: dict[str, Any] = {key: delta.text}
            if self.first:
                d = {"role": "assistant", **d}
            choice = P.chat_choice(d, None, delta.finish_reason, ids, prompt_ids)
        else:
            text = self.echo + delta.text if self.first else delta.text
            choice = P.completion_choice(text, delta.finish_reason, ids, prompt_ids)
        if delta.logprobs is not None:
            choice["logprobs"] = self._logprobs(delta.logprobs)
        self.first = False
        out = {**self._envelope(stream=True), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        if delta.finish_reason is not None:
            out["cbbench"] = self.gen.cbbench_field()
        return out

    def usage_chunk(self) -> dict[str, Any]:
        return {
            **self._envelope(stream=True),
            "choices": [],
            "usage": self._usage(),
            "cbbench": self.gen.cbbench_field(),
        }

    def final_body(self) -> dict[str, Any]:
        gen = self.gen
        ids = gen.token_ids if self.return_token_ids else None
        prompt_ids = gen.prompt_token_ids if self.return_token_ids else None
        if self.chat:
            text = {"content": gen.text} if gen.reasoning is None else gen.reasoning.message()
            message = {"role": "assistant", **text}
            choice = P.chat_choice(None, message, gen.finish_reason, ids, prompt_ids)
        else:
            choice = P.completion_choice(self.echo + gen.text, gen.finish_reason, ids, prompt_ids)
        if self.wants_logprobs:
            choice["logprobs"] = self._logprobs(gen.logprobs)
        return {
            **self._envelope(stream=False),
            "choices": [choice],
            "usage": self._usage(),
            "cbbench": gen.cbbench_field(),
        }


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a
