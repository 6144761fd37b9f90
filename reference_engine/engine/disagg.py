"""Prefill/decode roles inside the engine (a mixin of LLMEngine; docs/disaggregation.md).

Prefill side: a request added with `kv_export` runs as usual (its server asks for one
token); when it finishes, before its blocks go back to the pool, the executor copies the
prompt's blocks out into a KVPayload, which rides on the request's last RequestOutput.

Decode side: a request added with `kv_import` starts as prompt + the prefill worker's first
token, with the prompt's tokens "external" (a server sends that token at once:
`take_pending_outputs`): the scheduler admits it like any other (it waits
for a slot and blocks: the decode queue), counts the prompt as computed, and before the
step that computes it the payload is copied into the blocks it was given (vLLM's connector
does the same between scheduling and the forward). The first token is an output at once, as
it was when the request was added; if it already ends the request (EOS, max_tokens 1), the
request finishes without being scheduled. A sequence preempted later recomputes everything,
as any other: the payload is gone by then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cbbench.reference_engine.core.outputs import RequestOutput
from cbbench.reference_engine.core.sequence import Sequence, SequenceStatus
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.kv_transfer.payload import KVPayload, KVTransferError

if TYPE_CHECKING:
    from cbbench.reference_engine.core.executor import ScheduledChunk


class KVTransferMixin:
    _pending_outputs: list[RequestOutput]
    _kv_exports: dict[str, KVPayload]
    _num_importing: int

    def _init_kv_transfer(self) -> None:
        self._pending_outputs = []  # outputs made outside a step (an imported first token)
        self._kv_exports = {}  # request id -> payload, until its last output carries it
        self._num_importing = 0  # sequences whose payload waits for admission

    def _check_kv_role(self, kv_export: bool, kv_import: KVPayload | None) -> None:
        real = hasattr(self.executor, "kv_layout")  # type: ignore[attr-defined]
        if kv_export and not real:
            raise EngineError("KV export needs the real executor (the simulator has no KV)")
        if kv_import is not None and real != (kv_import.data is not None):
            raise EngineError("a simulated KV payload (no data) goes to a simulated engine")
        if (kv_export or kv_import is not None) and self.config.scheduler != "continuous":  # type: ignore[attr-defined]
            raise EngineError("prefill/decode roles need --scheduler continuous")
        if kv_export and kv_import is not None:
            raise EngineError("a request cannot both export and import its KV")

    def _start_imported(self, seq: Sequence, payload: KVPayload) -> bool:
        """Make `seq` a decode worker's sequence; True when its first token already ends it
        (then it is finished and never scheduled)."""
        if payload.num_tokens != seq.num_prompt_tokens:
            raise KVTransferError(
                f"request {seq.request_id!r}: the KV payload holds {payload.num_tokens} "
                f"tokens but the prompt has {seq.num_prompt_tokens}"
            )
        if payload.data is not None:
            self._check_payload(seq, payload)
        first = payload.first_token_id
        if not 0 <= first < self.model_config.vocab_size:  # type: ignore[attr-defined]
            raise KVTransferError(f"request {seq.request_id!r}: first token {first} unknown")
        seq.token_ids.append(first)
        now = seq.metrics.arrival_time  # the token is out as soon as the request is in
        seq.metrics.first_token_time = now
        reason = self._stop_reason(seq, first)  # type: ignore[attr-defined]
        if reason is None:
            seq.kv_import = payload
            seq.num_external_tokens = payload.num_tokens
            self._num_importing += 1
        else:
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason = reason
            seq.metrics.finished_time = now
            del self.seqs[seq.request_id]  # type: ignore[attr-defined]
        self._pending_outputs.append(
            RequestOutput(seq.request_id, [first], seq.num_prompt_tokens, 1,
                          reason is not None, reason, seq.metrics)  # fmt: skip
        )
        return reason is not None

    def _check_payload(self, seq: Sequence, payload: KVPayload) -> None:
        self.executor.kv_layout().check(payload.layout)  # type: ignore[attr-defined]
        want = self.executor.kv_payload_bytes(payload.num_blocks)  # type: ignore[attr-defined]
        if payload.nbytes != want:
            raise KVTransferError(
                f"request {seq.request_id!r}: KV payload of {payload.nbytes} bytes, "
                f"{want} expected for {payload.num_blocks} blocks"
            )

    def _load_imports(self, chunks: list[ScheduledChunk]) -> None:
        """Copy the payloads of sequences admitted in this step into their blocks."""
        for c in chunks:
            seq = c.seq
            if seq.kv_import is None:
                continue
            payload = seq.kv_import
            assert seq.num_computed_tokens == payload.num_tokens == seq.num_external_tokens
            if payload.data is not None:  # None: the simulator's (priced, not moved)
                self.executor.import_kv(seq.block_table[: payload.num_blocks], payload.data)  # type: ignore[attr-defined]
            else:  # the simulator's: the copy-in's time on this worker's loop
                self.executor.add_import(payload.num_tokens)  # type: ignore[attr-defined]
            seq.kv_import = None
            seq.num_external_tokens = 0
            self._num_importing -= 1

    def _forget_import(self, seq: Sequence) -> None:
        """An aborted sequence: its payload never loaded, its first token never sent."""
        if seq.kv_import is not None:
            seq.kv_import = None
            self._num_importing -= 1
        if self._pending_outputs:
            rid = seq.request_id
            self._pending_outputs = [o for o in self._pending_outputs if o.request_id != rid]

    def _export_kv(self, seq: Sequence) -> None:
        """Before a kv_export sequence's blocks are freed: copy its prompt's blocks out."""
        n = seq.num_prompt_tokens
        blocks = seq.block_table[: -(-n // self.block_manager.block_size)]  # type: ignore[attr-defined]
        ex = self.executor  # type: ignore[attr-defined]
        data = ex.export_kv(blocks)
        self._kv_exports[seq.request_id] = KVPayload(ex.kv_layout(), n, seq.token_ids[n], data)

    def _attach_exports(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            if out.finished:
                out.kv_transfer = self._kv_exports.pop(out.request_id, None)

    def _take_pending(self) -> list[RequestOutput]:
        out, self._pending_outputs = self._pending_outputs, []
        return out

    def take_pending_outputs(self) -> list[RequestOutput]:
        """The outputs made outside a step (imported first tokens): a server sends them as
        soon as the request is in, not after the next step's compute (step() would return
        them with its own outputs, a decode step late, together with the second token)."""
        return self._take_pending() if self._pending_outputs else []
