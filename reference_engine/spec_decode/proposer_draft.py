"""Draft-model proposer: a smaller model with the target's vocabulary proposes k tokens per
decoding sequence by k greedy steps (one varlen forward per step over all of them).

Its KV cache is a second paged cache with the target's block ids and block size, so it
reuses the target's block tables (and lookahead slots) as they are: no second allocator.
`seq.num_draft_computed` says how many leading tokens have valid draft K/V; the first step
of a proposal catches up from there (a new or preempted sequence prefills its whole context
into the draft cache), the engine rolls it back to the accepted tokens after verification.
Greedy requests get argmax drafts; sampled requests get drafts drawn from the draft's own
distribution under the request's temperature/top-k/top-p, and that distribution goes along
as q for the rejection sampler. With the target itself as draft (same preset and seed, or
the same folder) q = p and every draft is accepted, greedy or sampled: a 100%-acceptance
control that measures the mechanism's overhead.
"""

from __future__ import annotations

import torch
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.model_runner import BatchItem, ModelRunner, prepare_items
from cbbench.reference_engine.execution.sampler import Sampler
from cbbench.reference_engine.model.loader import resolve_config
from cbbench.reference_engine.sampling_params import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15
_SALT = 0x2545F491  # draft draws apart from the target sampler's for the same seed


class DraftModelProposer:
    def __init__(self, model: str, target: ModelRunner, max_model_len: int, seed: int = 0):
        cfg, tcfg = resolve_config(model), target.model_config  # checked before any weights
        if cfg.vocab_size != tcfg.vocab_size:
            raise EngineError(
                f"speculative model {model!r}: vocabulary of {cfg.vocab_size} tokens, the "
                f"target's has {tcfg.vocab_size}; a draft model must share the vocabulary"
            )
        if cfg.max_position_embeddings < max_model_len:
            raise EngineError(
                f"speculative model {model!r}: max_position_embeddings "
                f"{cfg.max_position_embeddings} < max_model_len {max_model_len}"
            )
        self.runner = ModelRunner(
            model,
            num_kv_blocks=target.num_kv_blocks,
            block_size=target.block_size,
            device=str(target.device),
            dtype=str(target.dtype).removeprefix("torch."),
            attention_backend=target.attention_backend_name,
            seed=seed,
            num_threads=torch.get_num_threads(),  # the target's setting, whatever the draft size
        )
        self.generator = torch.Generator(device=self.runner.device).manual_seed(seed ^ _SALT)
        self._row_generator = torch.Generator(device=self.runner.device)

    def _forward(self, items: list[BatchItem], chunks: list[ScheduledChunk]) -> list[int]:
        """One draft forward; the next draft of each chunk: the argmax for greedy requests,
        else a draw from the draft's distribution under the request's sampling params (kept
        in `spec_draft_probs` as q for the rejection sampler)."""
        r = self.runner
        b = prepare_items(items, r.block_size, r.model_config.vocab_size, r.device)
        hidden = r.model(b.input_ids, b.positions, b.max_position, r.kv_cache, b.meta, r.backend)
        logits = r.model.compute_logits(hidden[[row for _, row in b.sample_rows]])
        out = logits.argmax(dim=-1).tolist()
        sampled = [i for i, c in enumerate(chunks) if not c.seq.sampling_params.greedy]
        if sampled:
            params = [chunks[i].seq.sampling_params for i in sampled]
            probs = Sampler._probs(logits[sampled].float(), params)
            for j, i in enumerate(sampled):
                c = chunks[i]
                gen = self._generator(
                    c.seq.sampling_params, c.seq.num_tokens + len(c.spec_token_ids)
                )
                out[i] = int(torch.multinomial(probs[j], 1, generator=gen))
                c.spec_draft_probs = [*c.spec_draft_probs, probs[j]]
        return out

    def _generator(self, params: SamplingParams, position: int) -> torch.Generator:
        if params.seed is None:
            return self.generator
        return self._row_generator.manual_seed((params.seed * _SEED_MIX + position) % (1 << 63))

    def propose(self, chunks: list[ScheduledChunk]) -> None:
        active = [c for c in chunks if c.num_lookahead]
        if not active:
            return
        with torch.inference_mode():
            # step 0: catch up on tokens without draft K/V, ending with the last known token
            items = []
            for c in active:
                seq = c.seq
                start = min(seq.num_draft_computed, seq.num_tokens - 1)
                items.append(
                    BatchItem(seq.request_id, seq.token_ids[start:], start, seq.block_table, 1)
                )
            for c, tok in zip(active, self._forward(items, active), strict=True):
                c.spec_token_ids = [tok]
                c.seq.num_draft_computed = c.seq.num_tokens
            # steps 1..: feed each sequence's last draft while it wants more
            while True:
                live = [c for c in active if len(c.spec_token_ids) < c.num_lookahead]
                if not live:
                    break
                items = [
                    BatchItem(
                        c.seq.request_id,
                        c.spec_token_ids[-1:],
                        c.seq.num_tokens + len(c.spec_token_ids) - 1,
                        c.seq.block_table,
                        1,
                    )
                    for c in live
                ]
                for c, tok in zip(live, self._forward(items, live), strict=True):
                    c.spec_token_ids.append(tok)
                    c.seq.num_draft_computed += 1
