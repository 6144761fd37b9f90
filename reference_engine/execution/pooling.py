"""Embeddings from the model's hidden states, for pooling requests (`SamplingParams.embed`).

Pooling is LAST with L2 normalization, as vLLM's pooling runner does for decoder-only
embedding models: the final-norm hidden state of the prompt's last token, divided by its
norm. A pooling request is a one-token request that goes through the scheduler like any
other (continuous batching packs its prefill beside other requests' steps, chunked prefill
splits it); its prompt's last row is the row the step samples, so it is pooled when the
prefill's last chunk runs.
"""

from __future__ import annotations

import torch


def pooled(hidden: torch.Tensor, step) -> dict[str, list[float]]:
    """request id -> embedding, for the pooling requests whose prompt ended in this step."""
    rows = step.batch.sample_rows
    want = [r for r, q in enumerate(step.sample_requests) if q.params.embed]
    if not want:
        return {}
    vecs = torch.nn.functional.normalize(hidden[[rows[r][1] for r in want]].float(), dim=-1)
    return {step.request_ids[rows[r][0]]: v.tolist() for r, v in zip(want, vecs, strict=True)}
