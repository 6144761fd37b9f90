"""The routing policies over N simulated engines on one virtual clock: a cluster on a laptop.

Each replica is its own `LLMEngine` with the simulated executor (the same scheduler code and
cost model as `cbbench sim`). Events are taken in time order: an arrival is routed (the
policy sees every replica's running, waiting and KV usage as of that moment, and the
router's own in-flight counts) and added to its replica; otherwise the replica whose clock
is earliest runs one step. So a replica never runs ahead of an arrival it could have
received, and an idle replica's clock jumps to its next request. Sessions (sim/arrivals.py)
send turn k + 1 after turn k's reply, to whichever replica the policy picks then.

Per request it keeps times and counts, not per-token lists, so 100,000 requests over 1,000
replicas fit in memory (tests/benchmarks/test_router_bench.py records the cost). Every number
is SIMULATED.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.step_jitter import own_streams
from cbbench.reference_engine.router.policy import ReplicaLoad, RouteRequest, RoutingPolicy
from cbbench.reference_engine.router.prefix import token_block_hashes
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.sim.arrivals import Arrivals
from cbbench.reference_engine.sim.event_skip import (
    paused_gc,
    plan_skip,
    skip_blockers,
    take_steps,
)
from cbbench.reference_engine.sim.quiet import quiet_until
from cbbench.workloads.spec import RequestSpec
from cbbench.workloads.stats import describe
from cbbench.workloads.tokens import PromptTokenIds, id_pool


@dataclass(slots=True)
class ClusterRequest:
    index: int
    replica: int
    prompt_len: int
    output_len: int
    arrival_s: float
    turn: int | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    num_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0

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


@dataclass
class ReplicaTotals:
    """One replica over the run: steps, busy time, time-weighted load and KV usage."""

    requests: int = 0
    steps: int = 0
    busy_s: float = 0.0
    load_time: float = 0.0  # integral of (running + waiting) over the replica's steps
    kv_time: float = 0.0  # integral of KV usage over its steps
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class ClusterResult:
    policy: str
    num_replicas: int
    requests: list[ClusterRequest]  # in workload order
    replicas: list[ReplicaTotals]
    routing_time_s: list[float]  # wall time of each decision (prefix hashing included)
    wall_s: float  # the whole simulation's wall time
    skipped_steps: int = 0  # engine steps taken inside event-skipping windows (event_skip)
    caught_up: int = 0  # arrivals that met their replica left behind (sim/quiet.py)

    @property
    def duration_s(self) -> float:
        return max((r.finished_s or 0.0) for r in self.requests) if self.requests else 0.0

    def summary(self) -> dict:
        """Throughput, latencies, prefix-cache hit rate (all and turns >= 2), per-replica
        load and its imbalance: max/mean and coefficient of variation of requests routed and
        of time-averaged outstanding requests. SIMULATED, but the routing time (measured)."""
        dur = self.duration_s
        reqs = self.requests
        later = [r for r in reqs if (r.turn or 1) >= 2]
        tokens = sum(r.num_tokens for r in reqs)
        routed = [t.requests for t in self.replicas]
        load = [t.load_time / dur if dur > 0 else 0.0 for t in self.replicas]
        return {
            "simulated": True,
            "policy": self.policy,
            "num_replicas": self.num_replicas,
            "num_requests": len(reqs),
            "duration_s": dur,
            "request_throughput": len(reqs) / dur if dur > 0 else None,
            "output_throughput": tokens / dur if dur > 0 else None,
            "ttft_s": describe([r.ttft_s for r in reqs]),
            "ttft_later_turns_s": describe([r.ttft_s for r in later]),
            "tpot_s": describe([r.tpot_s for r in reqs]),
            "e2e_s": describe([r.e2e_s for r in reqs]),
            "prefix_cache_hit_rate": _rate(reqs),
            "prefix_cache_hit_rate_later_turns": _rate(later) if later else None,
            "num_preemptions": sum(r.num_preemptions for r in reqs),
            "requests_per_replica": imbalance(routed),
            "outstanding_per_replica": imbalance(load),
            "kv_usage_mean_per_replica": imbalance(
                [t.kv_time / dur if dur > 0 else 0.0 for t in self.replicas]
            ),
            "routing_time_s": describe(self.routing_time_s),
            "wall_s": self.wall_s,
        }


def _rate(reqs: Sequence[ClusterRequest]) -> float:
    return sum(r.num_cached_tokens for r in reqs) / max(1, sum(r.prompt_len for r in reqs))


def imbalance(values: Sequence[float]) -> dict:
    """mean, max, max/mean and the coefficient of variation (population std / mean)."""
    n = len(values)
    mean = sum(values) / n if n else 0.0
    if mean <= 0:
        return {"mean": mean, "max": max(values, default=0.0), "max_over_mean": None, "cv": None}
    var = sum((v - mean) ** 2 for v in values) / n
    return {
        "mean": mean,
        "max": max(values),
        "max_over_mean": max(values) / mean,
        "cv": math.sqrt(var) / mean,
    }


def _finished(r: ClusterRequest, m, tot: ReplicaTotals, load: ReplicaLoad) -> None:
    r.first_scheduled_s = m.first_scheduled_time
    r.first_token_s = m.first_token_time
    r.finished_s = m.finished_time
    r.num_preemptions = m.num_preemptions
    r.num_cached_tokens = m.num_cached_tokens
    tot.prompt_tokens += r.prompt_len
    tot.cached_tokens += m.num_cached_tokens
    load.ended()


@paused_gc()
def simulate_cluster(
    requests: Sequence[RequestSpec],
    config: EngineConfig,
    num_replicas: int,
    policy: RoutingPolicy,
    *,
    prefix_block_size: int = 512,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
    event_skip: bool = False,
) -> ClusterResult:
    """Replay `requests` over `num_replicas` simulated engines of `config`, routed by
    `policy`. `seed` and `prefix_block_size` (the workload's) give the prompt ids.
    `event_skip`: a replica's decode steps before its next event (and the next arrival)
    are taken k at once (sim/event_skip.py): the same results, far fewer engine steps."""
    if num_replicas < 1:
        raise EngineError(f"--replicas must be >= 1, got {num_replicas}")
    wall0 = time.perf_counter()
    cfg = replace(config, executor="sim")
    engines = [LLMEngine.from_config(cfg) for _ in range(num_replicas)]
    own_streams(engines)  # each replica its own jitter draws (step_jitter.py)
    for e in engines:
        assert e.now() == 0.0, "every simulated clock starts at 0"
    loads = [ReplicaLoad(i, f"r{i}") for i in range(num_replicas)]
    for load in loads:
        load.stats_read(0, 0, 0.0)  # empty engines: read before the first request
    totals = [ReplicaTotals() for _ in range(num_replicas)]
    vocab = engines[0].model_config.vocab_size
    arrivals = Arrivals(requests, PromptTokenIds(seed, prefix_block_size, id_pool(vocab)))
    recs: dict[str, ClusterRequest] = {}
    out_ids: dict[str, list[int]] = {}  # sessions' replies, until the next turn is built
    sessions = any(r.session_id is not None or r.graph is not None for r in requests)
    busy: list[tuple[float, int, int]] = []  # (clock, replica, gen) of those with work
    in_busy = [False] * num_replicas
    routing: list[float] = []
    done = 0
    closed = False
    skipping = event_skip and not skip_blockers(engines[0])
    # a replica decoding quietly (sim/quiet.py) may be left behind arrivals routed
    # elsewhere when the policy reads only outstanding counts: its heap key is then the
    # start of its first step that could change its count, and its steps are taken up to
    # there, or up to the arrival routed to it
    behind = skipping and not sessions and not policy.reads_engine_stats
    deferred = [False] * num_replicas
    gen = [0] * num_replicas  # heap entries of an older generation are stale
    skipped = caught_up = 0

    def wake(i: int) -> None:
        if not in_busy[i]:
            in_busy[i] = True
            heapq.heappush(busy, (engines[i].now(), i, gen[i]))

    def window(i: int, horizon: float | None) -> bool:
        """Replica i's decode steps before its next event and `horizon`, taken at once;
        False when its next step must be the scheduler's."""
        nonlocal skipped, done
        e = engines[i]
        plan = plan_skip(e, 1 << 40, events=True)
        if plan is None:
            return False
        w = take_steps(e, *plan, horizon, want_tokens=sessions, events=True,
                       end_on_finish=sessions, per_step=False)  # fmt: skip
        if w is None:
            return False
        sched, bm, tot = e.scheduler, e.block_manager, totals[i]
        skipped += w.k
        tot.steps += w.k  # the stepping path's sums, by window (same to rounding)
        tot.busy_s += w.ends[-1] - w.starts[0]
        tot.load_time += w.load_area
        tot.kv_time += w.kv_area / bm.num_blocks
        for j, seq in enumerate(w.seqs):
            r = recs[seq.request_id]
            r.num_tokens = seq.num_output_tokens
            if sessions:
                assert w.tokens is not None
                out_ids.setdefault(seq.request_id, []).extend(w.tokens[j])
        for seq in w.finished:
            done += 1
            _finished(recs[seq.request_id], seq.metrics, tot, loads[i])
            arrivals.on_finished(seq.request_id, seq.metrics.finished_time,
                                 out_ids.pop(seq.request_id, []))  # fmt: skip
            if on_progress is not None:
                on_progress(done, len(requests))
        loads[i].stats_read(sched.num_running, sched.num_waiting, bm.usage)
        return True

    def catch_up(i: int, t: float) -> None:
        """A replica left behind: its steps that start before t (none of them ends a
        request), as the stepping path would have taken them before an arrival at t."""
        nonlocal caught_up
        caught_up += 1
        deferred[i] = False
        gen[i] += 1
        in_busy[i] = False
        took = window(i, t)
        assert took and engines[i].has_unfinished_requests()
        wake(i)

    while arrivals.pending or busy:
        t_arr = arrivals.next_time()
        if t_arr is not None and (not busy or t_arr <= busy[0][0]):
            for spec, arrival, ids in arrivals.pop_due(t_arr):
                t = time.perf_counter()
                hashes = token_block_hashes(ids) if policy.needs_prefix else ()
                sid = spec.session_id if policy.needs_session else None
                i = policy.choose(RouteRequest(hashes, sid), loads)
                routing.append(time.perf_counter() - t)
                e = engines[i]
                if deferred[i]:
                    catch_up(i, arrival)
                if not in_busy[i]:
                    e.executor.advance_to(arrival)  # type: ignore[attr-defined]
                rid = f"req-{spec.index}"
                try:
                    e.add_request(
                        rid, ids, SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
                        priority=spec.priority, arrival_time=arrival,
                    )  # fmt: skip
                except EngineError as exc:
                    raise EngineError(f"workload request {spec.index}: {exc}") from None
                recs[rid] = ClusterRequest(
                    spec.index, i, len(ids), spec.output_len, arrival, spec.turn
                )
                loads[i].sent()
                totals[i].requests += 1
                wake(i)
            if not arrivals.pending and not closed:
                closed = True
                for e in engines:
                    e.close_input()
            continue
        if not busy:
            raise EngineError("cluster simulation stalled: sessions wait for replies, none runs")
        _, i, g = heapq.heappop(busy)
        if g != gen[i]:
            continue  # caught up since, and queued again under its own clock
        in_busy[i] = False
        was_behind, deferred[i] = deferred[i], False
        e = engines[i]
        sched = e.scheduler
        tot = totals[i]
        if (
            behind
            and not was_behind
            and t_arr is not None
            and (plan := plan_skip(e, 1 << 40, events=True))
        ):
            q = quiet_until(e, plan[0])
            if q is not None and q >= t_arr:  # nothing it does before t_arr shows: wait
                deferred[i] = in_busy[i] = True
                heapq.heappush(busy, (q, i, gen[i]))
                continue
        if skipping:
            horizon = arrivals.next_time()
            if sessions and busy:  # a reply elsewhere may send a turn before that
                horizon = busy[0][0] if horizon is None else min(horizon, busy[0][0])
            if window(i, horizon):
                if e.has_unfinished_requests():
                    wake(i)
                continue
        start = e.now()
        outputs = e.step()
        if e.last_scheduled:
            end = e.now()
            tot.steps += 1
            tot.busy_s += end - start
            tot.load_time += (sched.num_running + sched.num_waiting) * (end - start)
            bm = e.block_manager
            tot.kv_time += bm.num_used_blocks / bm.num_blocks * (end - start)
        for o in outputs:
            r = recs[o.request_id]
            r.num_tokens += len(o.new_token_ids)
            if sessions:
                out_ids.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                _finished(r, o.metrics, tot, loads[i])
                done += 1
                assert r.finished_s is not None
                arrivals.on_finished(o.request_id, r.finished_s, out_ids.pop(o.request_id, []))
                if on_progress is not None:
                    on_progress(done, len(requests))
        bm = e.block_manager
        kv = bm.num_used_blocks / bm.num_blocks
        loads[i].stats_read(sched.num_running, sched.num_waiting, kv)
        if e.has_unfinished_requests():
            if not e.last_scheduled:  # the policy waits (a batch to fill, a queue delay)
                t_wake = e.next_wakeup()
                if t_wake is None:
                    continue  # woken by its next request
                e.executor.advance_to(t_wake)  # type: ignore[attr-defined]
            wake(i)
    result = [recs[f"req-{s.index}"] for s in requests]
    return ClusterResult(
        policy.name,
        num_replicas,
        result,
        totals,
        routing,
        time.perf_counter() - wall0,
        skipped,
        caught_up,
    )
