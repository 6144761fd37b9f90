"""Test support for the model side: a minimal step loop that drives ModelRunner the way the
engine does (blocks from a shuffled pool, optional chunked prefill under a token budget), so
the model can be checked before and independently of the schedulers."""

from __future__ import annotations

import random

import torch
from cbbench.kernels import get_attention_backend
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.execution.model_runner import ModelRunner, prepare_batch
from cbbench.reference_engine.sampling_params import SamplingParams

_TORCH = get_attention_backend("torch", "cpu")


def make_seq(rid: str, prompt: list[int], max_tokens: int, **params) -> Sequence:
    sp = SamplingParams(max_tokens=max_tokens, temperature=params.pop("temperature", 0.0), **params)
    return Sequence(rid, list(prompt), sp, RequestMetrics(arrival_time=0.0))


def generate(
    runner: ModelRunner,
    seqs: list[Sequence],
    token_budget: int | None = None,
    pool_seed: int = 0,
    shuffle_pool: bool = True,
) -> list[list[int]]:
    """Run all sequences to max_tokens; returns each one's output tokens. Blocks are taken
    from a shuffled pool so that block tables are not contiguous, or with `shuffle_pool`
    False in increasing order, as a fresh block manager hands them out (a prompt's blocks
    consecutive, decode blocks interleaved between sequences)."""
    bs = runner.block_size
    pool = list(range(runner.num_kv_blocks))
    if shuffle_pool:
        random.Random(pool_seed).shuffle(pool)
    else:
        pool.reverse()  # pop() takes the lowest id first
    live = list(seqs)
    while live:
        chunks: list[ScheduledChunk] = []
        budget = token_budget if token_budget is not None else 1 << 30
        for seq in live:
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n <= 0:
                continue
            while len(seq.block_table) * bs < seq.num_computed_tokens + n:
                seq.block_table.append(pool.pop())
            chunks.append(ScheduledChunk(seq, n))
            budget -= n
        assert chunks, "budget too small to make progress"
        snapshot = [(c.seq.num_computed_tokens, list(c.seq.token_ids)) for c in chunks]
        results = runner.execute(chunks)
        assert snapshot == [(c.seq.num_computed_tokens, c.seq.token_ids) for c in chunks], (
            "execute must not mutate the sequences"
        )
        for c, toks in zip(chunks, results, strict=True):
            assert len(toks) == (1 if c.samples else 0)
            c.seq.num_computed_tokens += c.num_tokens
            c.seq.token_ids.extend(toks)
        for seq in [s for s in live if s.num_output_tokens >= s.sampling_params.max_tokens]:
            live.remove(seq)
            pool.extend(seq.block_table)
    return [s.output_token_ids for s in seqs]


def paged_logits(model, tokens: list[int], block_size: int = 4) -> torch.Tensor:
    """Last-position logits of one prompt through the model's paged forward (torch backend),
    its blocks scattered out of order."""
    cfg = model.config
    nblocks = -(-len(tokens) // block_size)
    seq = make_seq("r", tokens, 1)
    seq.block_table = list(reversed(range(nblocks)))
    kv = torch.zeros(
        cfg.num_hidden_layers,
        2,
        nblocks,
        block_size,
        cfg.num_key_value_heads,
        cfg.head_dim,
        dtype=model.model.embed_tokens.weight.dtype,
    )
    with torch.inference_mode():
        b = prepare_batch([ScheduledChunk(seq, len(tokens))], block_size, cfg.vocab_size, "cpu")
        hidden = model(b.input_ids, b.positions, b.max_position, kv, b.meta, _TORCH)
        return model.compute_logits(hidden[-1:])


# the shape of the transformers-made checkpoints (eos None: generate never stops early)
HF_TINY_SHAPE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=0,
)


def save_hf_model(tmp_path_factory, name: str, config) -> str:
    """A random transformers model saved with save_pretrained (biases made non-zero)."""
    import transformers

    torch.manual_seed(1234)
    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
    }[config.model_type]
    model = cls(config).eval()
    with torch.no_grad():  # transformers zero-initialises biases; make them count
        for pname, param in model.named_parameters():
            if pname.endswith("bias"):
                param.normal_(0.0, 0.2)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


def hf_greedy(path: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' own batched greedy generate (left padding, attention mask)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            pad_token_id=0,
        )
    return out[:, width:].tolist()
