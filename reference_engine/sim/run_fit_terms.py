"""What the from-run fit (run_fit.py) solves and says about its terms: the requests in
flight and the overhead outside the steps, the robust non-negative least squares, which
terms the runs identified, and what they cannot tell."""

from __future__ import annotations

import numpy as np
from cbbench.reference_engine.config.engine_config import ContinuousConfig, EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import nnls
from cbbench.workloads.spec import RequestSpec

# robust weights, in robust standard deviations of the residuals (95 % efficiency if normal):
# Huber's first (a convex start), then Tukey's bisquare (a stall far out gets no weight)
HUBER_K, TUKEY_C = 1.345, 4.685
# the server's settings the fit replays the runs with
SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "block_size",
            "num_kv_blocks", "enable_prefix_caching", "max_model_len",
            "tensor_parallel_size")  # fmt: skip
# recorded with them, not replayed: the fitted step times hold for the threads they ran with
RECORDED_ONLY = ("cpu_threads", "cpu_threads_bind")


def fit_part(run, holdout: float) -> list[bool]:  # run: run_fit.ObservedRun (it imports this)
    """Per request: in the fit part (sent in the first 1 - holdout of the run's sends)."""
    order = sorted(range(len(run.requests)), key=lambda i: run.requests[i].sent_s)
    k = max(1, round(len(order) * (1.0 - holdout)))
    keep = set(order[:k])
    return [i in keep for i in range(len(run.requests))]


def in_flight(sent: list[float], e2e: list[float]) -> np.ndarray:
    """Per request: how many others were in flight (sent, not yet finished) at its send."""
    s = np.asarray(sent, dtype=float)
    ends = np.sort(s + np.asarray(e2e, dtype=float))
    started = np.searchsorted(np.sort(s), s, side="right")  # itself included
    done = np.searchsorted(ends, s, side="right")
    return np.maximum(started - done - 1, 0).astype(float)


def overheads(coef: dict[str, float], load: np.ndarray) -> np.ndarray:
    return coef.get("c_req", 0.0) + coef.get("c_req_load", 0.0) * load


def robust_solve(rows: list, ys: list, irls: int = 6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NNLS over the stacked groups, each scaled by its mean target and its size; columns
    normalised; robust: re-weighted `irls` times on the residuals (scale: their median
    absolute deviation), Huber's weights for the first half, Tukey's bisquare after, so a
    few stalls of the server (a TTFT or a gap many times the rest) do not move the step
    terms. Returns (coefficients, scaled A, scaled b)."""
    blocks_a, blocks_b = [], []
    for r, y in zip(rows, ys, strict=True):
        if not r:
            continue
        a, b = np.array(r), np.array(y)
        scale = 1.0 / (max(float(b.mean()), 1e-9) * np.sqrt(len(b)))
        blocks_a.append(a * scale)
        blocks_b.append(b * scale)
    A, b = np.vstack(blocks_a), np.concatenate(blocks_b)
    norm = np.maximum(np.abs(A).max(axis=0), 1e-300)
    w = np.ones(len(b))
    for it in range(irls + 1):
        x = nnls(A / norm * w[:, None], b * w) / norm
        r = b - A @ x
        sigma = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        if sigma <= 0:
            break
        u = np.abs(r) / sigma
        if it < irls // 2:
            w = np.sqrt(np.minimum(1.0, HUBER_K / np.maximum(u, 1e-300)))
        else:
            w = np.where(u < TUKEY_C, 1.0 - (u / TUKEY_C) ** 2, 0.0)  # sqrt of (1 - u²)²
    return x, A, b


def identifiability(A: np.ndarray, b: np.ndarray, coef: dict[str, float],
                    names: tuple[str, ...]) -> dict[str, str]:  # fmt: skip
    """Per term: 'not exercised' (its feature was zero throughout), 'poorly identified' (its
    standard error over half its value, or it sits at 0 with others able to absorb it) or
    'identified (+-X %)'."""
    x = np.array([coef.get(t, 0.0) for t in names])
    resid = b - A @ x
    dof = max(1, len(b) - int((x > 0).sum()))
    sigma2 = float(resid @ resid) / dof
    out: dict[str, str] = {}
    active = x > 0
    cov = None
    if active.any():
        As = A[:, active]
        try:
            cov = np.linalg.pinv(As.T @ As) * sigma2
        except np.linalg.LinAlgError:
            cov = None
    idx = {j: i for i, j in enumerate(np.flatnonzero(active))}
    for j, t in enumerate(names):
        if not np.any(A[:, j]):
            out[t] = "not exercised"
        elif not active[j]:
            out[t] = "0 (the fit wants none)"
        elif cov is None:
            out[t] = "poorly identified"
        else:
            rel = float(np.sqrt(max(cov[idx[j], idx[j]], 0.0))) / x[j]
            out[t] = f"identified (+-{rel:.0%})" if rel < 0.5 else f"poorly identified (+-{rel:.0%})"
    return out


def what_runs_cannot_tell(runs: list, preds: list,  # of run_fit.ObservedRun, Predicted
                          settings: dict) -> list[str]:  # fmt: skip
    """The settings a black-box fit takes on trust, when the runs do not exercise them."""
    notes = []
    said = [r.num_preemptions for r in runs if r.num_preemptions is not None]
    if not any(p.num_preemptions for p in preds) and not any(said):
        src = "the server's settings" if settings.get("num_kv_blocks") else "nowhere (unknown)"
        notes.append("KV capacity: the runs never preempted, so they cannot tell how many KV "
                     f"blocks the server has; taken from {src}")  # fmt: skip
    seqs = settings.get("max_num_seqs")
    top = max((p.max_running for p in preds), default=0)
    if seqs is None or top < seqs:
        what = ("and the server did not say it: give --server-config max_num_seqs=N"
                if seqs is None else f"{seqs} assumed")  # fmt: skip
        notes.append(f"max_num_seqs: at most {top} requests ran at once, so the runs cannot "
                     f"tell the limit ({what})")  # fmt: skip
    if not any(p.budget_bound_steps for p in preds):
        notes.append("token budget: no step filled max_num_batched_tokens, so the runs "
                     "cannot tell it or how chunked prefill splits prompts")  # fmt: skip
    return notes


def vocab_size(model: str) -> int:
    from cbbench.reference_engine.model.config import resolve_model_config

    return resolve_model_config(model, shape_only=True).vocab_size


def engine_config(model: str, dtype: str, settings: dict, hardware: str,
                  reqs: list[RequestSpec]) -> EngineConfig:  # fmt: skip
    """The simulated server: continuous batching with the run's settings (vLLM's defaults
    where a setting is unknown: 256 sequences, chunked prefill with 2,048 tokens a step)."""
    unknown = sorted(set(settings) - set(SETTINGS) - set(RECORDED_ONLY))
    if unknown:
        raise EngineError(f"server settings: unknown {unknown} (known: {', '.join(SETTINGS)})")
    longest = max(r.prompt_len + r.output_len for r in reqs)
    max_len = int(settings.get("max_model_len") or max(longest, 2))
    budget = int(settings.get("max_num_batched_tokens") or 2048)
    chunked = bool(settings.get("enable_chunked_prefill", True))
    bs = int(settings.get("block_size") or 16)
    seqs = int(settings.get("max_num_seqs") or 256)
    blocks = settings.get("num_kv_blocks")
    if blocks is None:  # unknown: never the bottleneck (and said so)
        blocks = seqs * -(-max_len // bs) + 1
    return EngineConfig(
        model=model, dtype=dtype, scheduler="continuous", executor="sim", hardware=hardware,
        continuous=ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                                    enable_chunked_prefill=chunked),
        block_size=bs, num_kv_blocks=int(blocks), max_model_len=max(max_len, longest),
        enable_prefix_caching=bool(settings.get("enable_prefix_caching", False)),
        tensor_parallel_size=int(settings.get("tensor_parallel_size") or 1),
    )  # fmt: skip


def warm_prefix(bm, request_id: str, ids: list[int], num_tokens: int) -> None:
    """Register the full blocks of the first `num_tokens` of `ids` in `bm`'s prefix cache,
    as a finished request that had computed them leaves them (free, cached, evictable)."""
    from cbbench.reference_engine.core.outputs import RequestMetrics
    from cbbench.reference_engine.core.sequence import Sequence
    from cbbench.reference_engine.sampling_params import SamplingParams

    n = min(num_tokens, len(ids) - 1) // bm.block_size * bm.block_size
    if n <= 0 or not bm.enable_prefix_caching or bm.num_free_blocks < bm.blocks_for(n):
        return
    seq = Sequence(request_id, list(ids[:n]), SamplingParams(max_tokens=1), RequestMetrics(0.0))
    assert bm.allocate_slots(seq, n)
    seq.num_computed_tokens = n
    bm.cache_blocks(seq)
    bm.free(seq)


def initial_coef(runs: list) -> dict[str, float]:  # of run_fit.ObservedRun
    """A start: every step the median TPOT, prefill tokens priced from the quickest TTFTs."""
    reqs = [r for run in runs for r in run.requests]
    step = float(np.median([r.tpot_s for r in reqs if r.tpot_s] or [0.01]))
    per_tok = [max(0.0, r.ttft_s - step) / max(r.prompt_len, 1) for r in reqs]
    return {"c0": step, "c_tok": float(np.percentile(per_tok, 10))}


def jitter_ratios(run, part: list[bool], steps: list, sim_reqs: list, margin: int) -> list[float]:
    """The step jitter's samples (execution/step_jitter.py): each measured decode gap of a
    request in `part` whose span in the replay (`steps`: run_fit._StepLog.steps) is one step
    with no prefill chunk within `margin` steps (the replay places another request's chunk
    right to a step or two: the server's may have landed in this gap), and which no other
    request's measured prefill window (its send -> its first token: where the server's chunk
    and its front end's work for it must lie) overlaps, over that step's time. So the jitter
    is a decode-only step's: a chunk the replay misplaced by more than `margin` steps (its
    front end slower than the fit's mean) would otherwise count as jitter and price it into
    every step, a decode-only worker's too (issue #56: p99 x3.1 where those steps have 1.6)."""
    if not steps:
        return []
    span = np.array([e - s for s, e, _, _ in steps])
    chunk = np.array([w.num_tokens > w.num_seqs for _, _, w, _ in steps], dtype=float)
    near = np.convolve(chunk, np.ones(2 * margin + 1), mode="same") > 0
    samples: dict[str, list[int]] = {}
    for j, (_, _, _, items) in enumerate(steps):
        for rid, s in items:
            if s:
                samples.setdefault(rid, []).append(j)
    opens = np.array([r.sent_s for r in run.requests], dtype=float)
    closes = opens + np.array([r.ttft_s for r in run.requests], dtype=float)
    out = []
    for n, (obs, sim, q) in enumerate(zip(run.requests, sim_reqs, part, strict=True)):
        js = samples.get(sim.request_id, [])
        if not q or len(obs.itl_s) != len(js) - 1:
            continue
        ends = obs.sent_s + obs.ttft_s + np.cumsum(obs.itl_s)
        for k, gap in enumerate(obs.itl_s, 1):
            j = js[k]
            if j - js[k - 1] != 1 or near[j] or span[j] <= 0:
                continue
            t0, t1 = ends[k - 1] - gap, ends[k - 1]
            hit = (opens < t1) & (closes > t0)
            hit[n] = False
            if not hit.any():
                out.append(gap / span[j])
    return out
