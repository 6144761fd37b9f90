"""Prefill and decode pools on one virtual clock: a disaggregated cluster in the simulator
(and, with no prefill pool, the aggregated one it is compared with, on the same loop).

Each worker is its own simulated `LLMEngine` with its own scheduler. A request arrives at
the prefill worker with the fewest outstanding requests and runs its prompt there (one
token asked); when that token is out, its KV (the cost model's bytes per token over the
prompt's whole blocks, so the KV dtype counts) crosses the link (`execution/kv_link.py`:
latency + bytes / bandwidth; plus the decode server's front end where a fit prices one and
the link is not the measured hand-off that holds it: sim/pd_link.py), then enters the decode worker with the most KV headroom as an
imported request (engine/disagg.py: it waits for a slot and blocks, its prompt counted as
computed, its first token out on arrival; its copy-in charged to the step that admits it,
execution/kv_import.py) and decodes there. Events are taken in time
order: an arrival or a transfer's end is handled once every busy worker's clock has reached
it, else the busy worker with the earliest clock runs one step.

Per request: TTFT (arrival -> first token at the decode worker, the transfer included),
TPOT, E2E, the phases (prefill queue, prefill, transfer, decode queue, decode) and, when
asked, every token's time (ITL). Every number is SIMULATED.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.kv_link import KVLink
from cbbench.reference_engine.execution.step_jitter import own_streams
from cbbench.reference_engine.kv_transfer.payload import KVPayload
from cbbench.reference_engine.router.cluster_sim import ReplicaTotals
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.sim.arrivals import Arrivals
from cbbench.workloads.spec import RequestSpec
from cbbench.workloads.stats import describe
from cbbench.workloads.tokens import PromptTokenIds, id_pool


@dataclass
class PDRequest:
    index: int
    prompt_len: int
    output_len: int
    arrival_s: float
    prefill_worker: int | None = None
    decode_worker: int | None = None
    prefill_start_s: float | None = None
    prefill_end_s: float | None = None  # the prefill worker's first token
    transfer_end_s: float | None = None  # = the decode worker's arrival
    decode_start_s: float | None = None  # admitted by the decode worker
    first_token_s: float | None = None
    finished_s: float | None = None
    num_tokens: int = 0
    kv_bytes: int = 0
    token_times_s: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.num_tokens < 2 or self.first_token_s is None or self.finished_s is None:
            return None
        return (self.finished_s - self.first_token_s) / (self.num_tokens - 1)

    def phases(self) -> dict[str, float | None]:
        def d(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        return {
            "prefill_queue_s": d(self.arrival_s, self.prefill_start_s),
            "prefill_s": d(self.prefill_start_s, self.prefill_end_s),
            "kv_transfer_s": d(self.prefill_end_s, self.transfer_end_s),
            "decode_queue_s": d(self.transfer_end_s, self.decode_start_s),
            "decode_s": d(self.decode_start_s, self.finished_s),
        }


@dataclass
class PDResult:
    mode: str  # "disaggregated" | "aggregated"
    num_prefill: int
    num_decode: int
    link: str | None
    requests: list[PDRequest]
    replicas: list[ReplicaTotals]  # prefill workers first

    @property
    def duration_s(self) -> float:
        return max((r.finished_s or 0.0) for r in self.requests) if self.requests else 0.0

    def itl_s(self) -> list[float]:
        return [b - a for r in self.requests for a, b in itertools.pairwise(r.token_times_s)]

    def summary(self) -> dict:
        dur, reqs = self.duration_s, self.requests
        tokens = sum(r.num_tokens for r in reqs)
        out = {
            "simulated": True,
            "mode": self.mode,
            "num_prefill": self.num_prefill,
            "num_decode": self.num_decode,
            "link": self.link,
            "num_requests": len(reqs),
            "duration_s": dur,
            "request_throughput": len(reqs) / dur if dur > 0 else None,
            "output_throughput": tokens / dur if dur > 0 else None,
            "ttft_s": describe([r.ttft_s for r in reqs]),
            "tpot_s": describe([r.tpot_s for r in reqs]),
            "e2e_s": describe([r.e2e_s for r in reqs]),
        }
        if any(r.token_times_s for r in reqs):
            out["itl_s"] = describe(self.itl_s())
        if self.mode == "disaggregated":
            out["phases"] = {k: describe([r.phases()[k] for r in reqs])
                             for k in reqs[0].phases()} if reqs else {}  # fmt: skip
            out["kv_transfer_bytes_mean"] = sum(r.kv_bytes for r in reqs) / max(1, len(reqs))
        return out


def simulate_pd(
    requests: Sequence[RequestSpec],
    config: EngineConfig,
    num_prefill: int,
    num_decode: int,
    link: KVLink | None = None,
    *,
    prefill_config: EngineConfig | None = None,
    prefix_block_size: int = 512,
    seed: int = 0,
    token_times: bool = False,
    slowdown: Sequence[Callable[[float], float] | None] | None = None,
    poll_interval_s: float | None = None,
    decode_overhead: dict[str, float] | None = None,
) -> PDResult:
    """`num_prefill` prefill and `num_decode` decode workers of `config` (the prefill pool
    may have its own, `prefill_config`), the transfer priced by `link`; `num_prefill` 0:
    `num_decode` aggregated workers serving whole requests (least outstanding).
    `slowdown`, one per worker (prefill workers first): workers sharing a host's cores, each
    step starting at t takes slowdown(t) times its hardware's time (a measured contention
    timeline; None: the worker has its device to itself, as on a GPU of its own).
    `poll_interval_s`: the router reads each worker's running + waiting every that many
    seconds (the served router's `--poll-interval`) and takes the larger of that read and
    its own in-flight count (router/policy.py: ReplicaLoad), so a request that ended since
    the last read still counts; None: the exact count at the arrival.
    `decode_overhead` (a from-run fit's `c_req`, `c_req_load`: one server's front end): the
    decode server's API, paid by each request on its second server hop, after the link and
    before the decode worker (`c_req + c_req_load x` the decode servers' mean outstanding
    requests); None where the link is a measured hand-off, which holds it already."""
    if num_decode < 1 or num_prefill < 0:
        raise EngineError(f"P/D simulation needs >= 1 decode and >= 0 prefill workers, got "
                          f"{num_prefill}:{num_decode}")  # fmt: skip
    if num_prefill and link is None:
        raise EngineError("a disaggregated simulation needs a KV link (--kv-link)")
    if any(r.session_id is not None for r in requests):
        raise EngineError("the P/D simulation replays single requests, not sessions")
    cfg = replace(config, executor="sim", role="both")
    pcfg = replace(prefill_config or config, executor="sim", role="both")
    engines = [LLMEngine.from_config(pcfg) for _ in range(num_prefill)]
    engines += [LLMEngine.from_config(cfg) for _ in range(num_decode)]
    own_streams(engines)  # each worker its own jitter draws (step_jitter.py)
    is_prefill = [i < num_prefill for i in range(len(engines))]
    for e, f in zip(engines, slowdown or (), strict=False):
        e.executor.slowdown = f  # type: ignore[attr-defined]
    totals = [ReplicaTotals() for _ in engines]
    outstanding = [0] * len(engines)
    # each worker's outstanding count over time, for the router's last read (poll_interval_s)
    history: list[tuple[list[float], list[int]]] = [([0.0], [0]) for _ in engines]
    vocab = engines[-1].model_config.vocab_size
    arrivals = Arrivals(requests, PromptTokenIds(seed, prefix_block_size, id_pool(vocab)))
    per_token = engines[-1].executor.cost_model.kv_bytes_per_token  # type: ignore[attr-defined]
    block = engines[-1].block_manager.block_size
    recs: dict[str, PDRequest] = {}
    prompts: dict[str, list[int]] = {}
    transfers: list[tuple[float, int, str, int]] = []  # (arrives, seq, request id, first token)
    counter = itertools.count()
    prefills = range(num_prefill)
    decodes = range(num_prefill, len(engines))

    def count(i: int, delta: int, t: float) -> None:
        outstanding[i] += delta
        if poll_interval_s:
            ts, ns = history[i]
            ts.append(max(t, ts[-1]))
            ns.append(outstanding[i])

    def seen(i: int, t: float) -> int:
        """The router's count of worker i at t: max(its own, the worker's at the last read)."""
        if not poll_interval_s:
            return outstanding[i]
        ts, ns = history[i]
        read = (t // poll_interval_s) * poll_interval_s
        return max(outstanding[i], ns[bisect.bisect_right(ts, read) - 1])

    def pick(pool: range, by_kv: bool, t: float) -> int:
        def key(i: int) -> tuple:
            bm = engines[i].block_manager
            return (bm.num_used_blocks / bm.num_blocks if by_kv else 0.0, seen(i, t), i)

        return min(pool, key=key)

    def add(i: int, rid: str, ids: list[int], params: SamplingParams, t: float, **kv) -> None:
        e = engines[i]
        if not e.has_unfinished_requests():
            e.executor.advance_to(t)  # type: ignore[attr-defined]
        try:
            e.add_request(rid, ids, params, arrival_time=t, **kv)
        except EngineError as exc:
            raise EngineError(f"workload request {recs[rid].index}: {exc}") from None
        count(i, 1, t)
        totals[i].requests += 1

    while arrivals.pending or transfers or any(e.has_unfinished_requests() for e in engines):
        busy = [(e.now(), i) for i, e in enumerate(engines) if e.has_unfinished_requests()]
        t_step = min(busy)[0] if busy else float("inf")
        t_arr = arrivals.next_time()
        t_xfer = transfers[0][0] if transfers else None
        if t_xfer is not None and t_xfer <= t_step and (t_arr is None or t_xfer <= t_arr):
            t, _, rid, first = heapq.heappop(transfers)
            r = recs[rid]
            i = pick(decodes, by_kv=True, t=t)
            r.decode_worker, r.transfer_end_s = i, t
            payload = KVPayload(None, r.prompt_len, first, None)  # type: ignore[arg-type]
            add(i, rid, prompts.pop(rid), SamplingParams(max_tokens=r.output_len,
                ignore_eos=True), t, kv_import=payload)  # fmt: skip
            continue
        if t_arr is not None and t_arr <= t_step:
            for spec, t, ids in arrivals.pop_due(t_arr):
                rid = f"req-{spec.index}"
                recs[rid] = PDRequest(spec.index, len(ids), spec.output_len, t)
                if num_prefill:
                    i = pick(prefills, by_kv=False, t=t)
                    recs[rid].prefill_worker = i
                    prompts[rid] = ids
                    add(i, rid, ids, SamplingParams(max_tokens=1, ignore_eos=True), t)
                else:
                    i = pick(decodes, by_kv=False, t=t)
                    recs[rid].decode_worker = i
                    add(i, rid, ids, SamplingParams(max_tokens=spec.output_len,
                        ignore_eos=True), t)  # fmt: skip
            continue
        if not busy:
            break
        _, i = min(busy)
        e = engines[i]
        start = e.now()
        outputs = e.step()
        end = e.now()
        if e.last_scheduled:
            totals[i].steps += 1
            totals[i].busy_s += end - start
        elif not outputs:  # nothing schedulable: wait for the next event
            nxt = min(x for x in (t_arr, t_xfer, end + 1e-3) if x is not None)
            e.executor.advance_to(max(nxt, end + 1e-6))  # type: ignore[attr-defined]
            continue
        for o in outputs:
            r = recs[o.request_id]
            m = o.metrics
            if is_prefill[i]:
                if o.finished:
                    count(i, -1, m.finished_time or end)
                    r.prefill_start_s, r.prefill_end_s = m.first_scheduled_time, m.first_token_time
                    r.kv_bytes = -(-r.prompt_len // block) * block * per_token
                    assert link is not None and r.prefill_end_s is not None
                    hop = 0.0
                    if decode_overhead:  # the decode server's front end, at its load
                        load = sum(outstanding[j] for j in decodes) / len(decodes)
                        hop = (decode_overhead.get("c_req", 0.0)
                               + decode_overhead.get("c_req_load", 0.0) * load)  # fmt: skip
                    heapq.heappush(transfers, (r.prefill_end_s + link.transfer_s(r.kv_bytes)
                                   + hop, next(counter), o.request_id, o.new_token_ids[-1]))  # fmt: skip
                continue
            r.num_tokens += len(o.new_token_ids)
            if token_times:
                r.token_times_s += [end if r.first_token_s is not None or num_prefill == 0
                                    else m.first_token_time] * len(o.new_token_ids)  # fmt: skip
            if r.first_token_s is None:
                r.first_token_s = m.first_token_time
            if o.finished:
                count(i, -1, m.finished_time or end)
                r.decode_start_s = m.first_scheduled_time
                if num_prefill == 0:
                    r.prefill_start_s = m.first_scheduled_time
                r.finished_s = m.finished_time
                arrivals.on_finished(o.request_id, m.finished_time, [])
    result = [recs[f"req-{s.index}"] for s in requests]
    mode = "disaggregated" if num_prefill else "aggregated"
    return PDResult(mode, num_prefill, num_decode, link.name if link and num_prefill else None,
                    result, totals)  # fmt: skip
