"""The probe's designed workloads: small, deterministic, sized from what the calibration
phase measured (time per output token, a lone request's TTFT, the server's max_model_len)."""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.workloads.spec import RequestSpec, Workload

SHORT_PROMPT = 16
BURST = 16
SHORTS = 6
LADDER = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Pace:
    """What calibration measured: seconds per output token at batch 1, a lone request's TTFT."""

    tpot_s: float
    ttft_s: float
    max_model_len: int

    @property
    def long_prompt(self) -> int:
        """A prompt long enough for its prefill to show, within the model's context."""
        return max(64, min(1024, (self.max_model_len - 64) // 16 * 16))

    def long_output(self, seconds: float = 2.0) -> int:
        """Output tokens of a request that decodes for about `seconds` alone."""
        n = int(seconds / max(self.tpot_s, 1e-4))
        return max(48, min(n, 512, self.max_model_len - SHORT_PROMPT - 8))


_SEED = [0]


def set_seed(seed: int) -> None:
    """Each probe draws its prompts from its own seed, so a server's prefix cache never holds
    a "fresh" prompt from an earlier probe; phases add their own offset."""
    _SEED[0] = seed


def _wl(name: str, reqs: list[RequestSpec], block: int = 512) -> Workload:
    seed = _SEED[0] + sum(map(ord, name)) * 7919
    return Workload(name=f"probe/{name}", seed=seed, requests=tuple(reqs), prefix_block_size=block)


CALIBRATE = 5  # lone requests whose medians are the pace, after CALIBRATE_WARMUP uncounted


CALIBRATE_WARMUP = 1  # the first lone request pays one-off costs (allocation, kernels)


def calibrate() -> Workload:
    """CALIBRATE lone requests, one after another (closed loop, concurrency 1), the same
    shape as the max-batch ladder's concurrency-1 level so the two agree."""
    return _wl("calibrate", [RequestSpec(i, SHORT_PROMPT, 16) for i in range(CALIBRATE)])


def burst() -> Workload:
    """BURST requests at once: how many start together (the first TTFT cluster)."""
    return _wl("burst", [RequestSpec(i, SHORT_PROMPT, 16, 0.0) for i in range(BURST)])


def batching(p: Pace) -> tuple[Workload, int]:
    """One long request at t=0 and SHORTS short ones arriving while it decodes: under
    iteration-level batching they finish while it runs, under request-level batching they
    wait for it. Arrivals start after a lone request's TTFT (a batcher's start delay)."""
    n_long = p.long_output()
    t_long = n_long * p.tpot_s
    start = p.ttft_s + 0.15 * t_long
    step = 0.5 * t_long / SHORTS
    reqs = [RequestSpec(0, SHORT_PROMPT, n_long, 0.0)]
    reqs += [RequestSpec(i + 1, SHORT_PROMPT, 4, start + i * step) for i in range(SHORTS)]
    return _wl("batching", reqs), n_long


def ladder_level(c: int) -> Workload:
    """Closed loop at concurrency c: 2c requests (at least 4) of 16 output tokens."""
    return _wl(f"concurrency-{c}", [RequestSpec(i, SHORT_PROMPT, 16) for i in range(max(4, 2 * c))])


# prefix-cache order: W = warm-up (a fresh long prompt, not counted: the first long prompt a
# server sees may pay one-off costs), P = the first time the repeated prompt is seen (a miss,
# counted with the fresh ones), R = the repeated prompt, F = a fresh prompt
PREFIX_PATTERN = "WPRFRFRFRFRF"


def prefix_cache(p: Pace) -> Workload:
    """Sequential long prompts: one prompt repeated, interleaved with fresh ones."""
    n = p.long_prompt
    reqs = []
    for i, kind in enumerate(PREFIX_PATTERN):
        reqs.append(RequestSpec(i, n, 2, None, 0, (1,) if kind in "PR" else ()))
    return _wl("prefix-cache", reqs, block=n)


# a prompt longer than any common default step budget (vLLM: 2,048 to 16,384 tokens), used
# when the server does not say its own
CHUNK_PROMPT_MAX = 16384 + 1024


def chunk_prompt(p: Pace, budget: int | None) -> int:
    """The chunked-prefill test prompt: longer than the step budget where the server says it
    (four times it, within the context: at least four chunks, so a stream's longest stall is
    about a quarter of the prefill, well apart from the whole-prefill stall of no chunking;
    at twice it, half, which the verdict cannot tell apart), else as long as the context
    allows up to CHUNK_PROMPT_MAX: a prompt that fits one step shows no chunking whether
    chunking is on or off."""
    room = (p.max_model_len - 64) // 16 * 16
    want = 4 * budget if budget else CHUNK_PROMPT_MAX
    return max(64, min(room, want))


def chunked_prefill(
    p: Pace, streams: int = 3, prompts: int = 3, prompt_len: int | None = None
) -> Workload:
    """`streams` requests decoding for a while; `prompts` fresh long prompts arrive while
    they run. How a prefill splits across the streams' token gaps shows chunking."""
    prompt_len = prompt_len or p.long_prompt
    n_out = p.long_output(2.5)
    t_run = n_out * p.tpot_s
    reqs = [RequestSpec(i, SHORT_PROMPT, n_out, 0.0) for i in range(streams)]
    for k in range(prompts):
        at = p.ttft_s + (0.2 + 0.2 * k) * t_run
        reqs.append(RequestSpec(streams + k, prompt_len, 2, at))
    return _wl("chunked-prefill", reqs)
