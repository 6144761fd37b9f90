"""The accuracy cost of a quantized KV cache or of lower-precision weights, measured: the same
model, the same tokens, once in the reference configuration (fp32 weights, KV cache in the model
dtype) and once per variant (`Variant(dtype, kv_cache_dtype, quantization)`: weight dtype, KV
storage and int8 weight-only quantization).
`kv_quality(model, kv_cache_dtype)` is the one-variant form (fp32 weights); `quality(model,
variants)` runs the reference once for all variants (`cbbench quality`).

Teacher-forced: each sequence's random prompt is prefilled in both runners, then for
`gen_len` decode steps both are fed the reference's greedy token, and the next-token
distributions are compared at every position (the one after the prompt included): greedy
agreement (argmax equal), |logprob difference| of the reference's greedy token (mean, max)
and KL(reference || quantized) (mean, max). Prefill and decode attention both read the
quantized cache.

Random weights give near-uniform next-token distributions, on which every metric looks
perfect. `logit_scale` multiplies the logits (the same as scaling the LM head's random init)
so that they are peaked: at the default 32, `tiny`'s top token takes 54 % of the mass on
average (at 1, 0.3 %: uniform over 512 would be 0.2 %).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from cbbench.reference_engine.execution.model_runner import BatchItem, ModelRunner, prepare_items


@dataclass(frozen=True)
class Variant:
    dtype: str = "float32"  # weights and activations (EngineConfig.dtype names)
    kv_cache_dtype: str = "auto"  # KV storage (EngineConfig.kv_cache_dtype names)
    quantization: str | None = None  # weight-only: "int8" (EngineConfig.quantization)


@dataclass
class KVQuality:
    kv_cache_dtype: str
    positions: int  # compared next-token distributions
    greedy_agreement: float  # fraction of positions with the same argmax
    logprob_diff_mean: float  # |lp_q - lp_ref| of the reference's greedy token
    logprob_diff_max: float
    kl_mean: float  # KL(ref || quantized), nats
    kl_max: float
    top1_prob_mean: float  # how peaked the reference is (uniform would be 1 / vocab)
    dtype: str = "float32"  # the variant's weight dtype
    quantization: str | None = None  # the variant's weight-only quantization

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def kv_quality(
    model: str = "tiny",
    kv_cache_dtype: str = "int8",
    *,
    num_seqs: int = 4,
    prompt_len: int = 32,
    gen_len: int = 32,
    logit_scale: float = 32.0,
    block_size: int = 16,
    seed: int = 0,
    attention_backend: str = "torch",
) -> KVQuality:
    """Compare `kv_cache_dtype` against the model dtype's cache on `num_seqs` sequences."""
    return quality(
        model, [Variant("float32", kv_cache_dtype)], num_seqs=num_seqs, prompt_len=prompt_len,
        gen_len=gen_len, logit_scale=logit_scale, block_size=block_size, seed=seed,
        attention_backend=attention_backend,
    )[0]  # fmt: skip


def quality(
    model: str = "tiny",
    variants: list[Variant] | None = None,
    *,
    num_seqs: int = 4,
    prompt_len: int = 32,
    gen_len: int = 32,
    logit_scale: float = 32.0,
    block_size: int = 16,
    seed: int = 0,
    attention_backend: str = "torch",
) -> list[KVQuality]:
    """Each variant against the reference (fp32 weights, model-dtype KV), one row each."""
    variants = variants if variants is not None else [Variant("float32", "int8")]
    assert num_seqs >= 1 and prompt_len >= 1 and gen_len >= 0 and variants
    per_seq = -(-(prompt_len + gen_len) // block_size)
    runners = [
        ModelRunner(model, num_kv_blocks=num_seqs * per_seq, block_size=block_size, seed=seed,
                    dtype=v.dtype, kv_cache_dtype=v.kv_cache_dtype, quantization=v.quantization,
                    attention_backend=attention_backend)
        for v in [Variant("float32", "auto"), *variants]
    ]  # fmt: skip
    vocab = runners[0].model_config.vocab_size
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = [
        torch.randint(1, vocab, (prompt_len,), generator=gen).tolist() for _ in range(num_seqs)
    ]
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(num_seqs)]
    lps: list[list[torch.Tensor]] = [[] for _ in runners]
    for step in range(gen_len + 1):
        if step == 0:  # prefill the prompts
            items = [BatchItem(f"s{i}", t, 0, tables[i], 1) for i, t in enumerate(tokens)]
        else:
            items = [
                BatchItem(f"s{i}", [t[-1]], len(t) - 1, tables[i], 1) for i, t in enumerate(tokens)
            ]
        out = [_logprobs(r, items, logit_scale) for r in runners]
        for acc, lp in zip(lps, out, strict=True):
            acc.append(lp)
        for i, t in enumerate(tokens):  # teacher forcing: the reference's greedy token
            t.append(int(out[0][i].argmax()))
    ref = torch.cat(lps[0])
    return [_compare(v, ref, torch.cat(lp)) for v, lp in zip(variants, lps[1:], strict=True)]


def _compare(variant: Variant, ref: torch.Tensor, q: torch.Tensor) -> KVQuality:
    top = ref.argmax(-1, keepdim=True)
    diff = (q.gather(-1, top) - ref.gather(-1, top)).abs()
    kl = (ref.exp() * (ref - q)).sum(-1).clamp_min(0.0)
    return KVQuality(
        kv_cache_dtype=variant.kv_cache_dtype,
        positions=ref.shape[0],
        greedy_agreement=float((q.argmax(-1) == ref.argmax(-1)).float().mean()),
        logprob_diff_mean=float(diff.mean()),
        logprob_diff_max=float(diff.max()),
        kl_mean=float(kl.mean()),
        kl_max=float(kl.max()),
        top1_prob_mean=float(ref.exp().max(-1).values.mean()),
        dtype=variant.dtype,
        quantization=variant.quantization,
    )


def _logprobs(runner: ModelRunner, items: list[BatchItem], logit_scale: float) -> torch.Tensor:
    """Next-token log-probabilities (fp32) of each item's last row."""
    cfg = runner.model_config
    b = prepare_items(items, runner.block_size, cfg.vocab_size, runner.device)
    with torch.inference_mode():
        hidden = runner.model(
            b.input_ids, b.positions, b.max_position, runner.kv_cache, b.meta, runner.backend
        )
        logits = runner.model.compute_logits(hidden[[row for _, row in b.sample_rows]])
    return torch.log_softmax(logits.float() * logit_scale, dim=-1).cpu()
