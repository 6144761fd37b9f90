"""Prometheus metrics under vLLM's names, so existing dashboards and scrapers work.

One CollectorRegistry per server (no global state). Gauges are set after every engine step;
counters and histograms are fed from each RequestOutput, on the engine's clock. Only the
engine thread writes; prometheus-client is thread-safe for the scrape.
"""

from __future__ import annotations

from cbbench.reference_engine.core.outputs import EngineStats, RequestOutput
from cbbench.reference_engine.core.spec_decode_stats import SpecDecodeStats
from cbbench.reference_engine.server.kv_metrics import KVTransferMetrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket edges as vLLM uses them (seconds).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


# Host-side step timings: tens of microseconds (a scheduler decision) to seconds (a stall).
STEP_BUCKETS = (
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)


class ServerMetrics:
    def __init__(self, model_name: str, scheduler: str):
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r, multiprocess_mode="livemostrecent")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=r, buckets=buckets)

        m = self._model = model_name
        self.num_running = gauge(
            "vllm:num_requests_running", "Requests in the running batch."
        ).labels(m)
        self.num_waiting = gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled."
        ).labels(m)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent."
        ).labels(m)
        self.batch_occupancy = gauge(
            "cbbench:batch_occupancy", "Scheduled sequences / batch slots, last step."
        ).labels(m)
        self.kv_reserved_unused = gauge(
            "cbbench:kv_reserved_unused_tokens",
            "KV slots reserved but not (yet) filled: static/dynamic waste.",
        ).labels(m)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative preemptions.").labels(m)
        # --max-num-seqs auto (scheduler/adaptive_limit.py): the limit and its decisions
        self.num_seqs_limit = gauge(
            "cbbench:max_num_seqs_limit",
            "Running limit admission obeyed in the last step (adaptive with --max-num-seqs auto).",
        ).labels(m)
        changes = Counter(
            "cbbench:max_num_seqs_changes",
            "Decisions of the adaptive running limit (--max-num-seqs auto), by direction.",
            ["model_name", "direction"],
            registry=r,
        )
        self.limit_changes = {d: changes.labels(m, d) for d in ("up", "down")}
        self._limit_changes_seen = {"up": 0, "down": 0}
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.").labels(m)
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.").labels(m)
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        ).labels(m)
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache."
        ).labels(m)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS
        ).labels(m)
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS
        ).labels(m)
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", REQUEST_BUCKETS
        ).labels(m)
        self.queue_time = histogram(
            # TTFT's finer buckets: this engine's queue times are often well under vLLM's
            # first request bucket (0.3 s), which would make histogram estimates useless
            "vllm:request_queue_time_seconds",
            "Arrival to first scheduled.",
            TTFT_BUCKETS,
        ).labels(m)
        # speculative decoding, vLLM v1's names (counters get the _total suffix)
        self.spec_drafts = counter(
            "vllm:spec_decode_num_drafts", "Verified speculative proposals."
        ).labels(m)
        self.spec_draft_tokens = counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens scored by the target."
        ).labels(m)
        self.spec_accepted_tokens = counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted."
        ).labels(m)
        self.spec_accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, per position in the proposal.",
            ["model_name", "position"],
            registry=r,
        )
        self._spec_seen: SpecDecodeStats | None = None
        self.scheduler_time = histogram(
            "cbbench:scheduler_time_seconds",
            "Host time to build one engine step: scheduler decision and input preparation.",
            STEP_BUCKETS,
        ).labels(m)
        self.step_gap = histogram(
            "cbbench:engine_step_gap_seconds",
            "Time the executor sat idle between two consecutive steps while work was pending.",
            STEP_BUCKETS,
        ).labels(m)
        self._steps_seen = 0
        info = Gauge(
            "cbbench:scheduler_info",
            "The batching policy of this server.",
            ["model_name", "scheduler"],
            registry=r,
        )
        info.labels(m, scheduler).set(1)
        self._preempted_seen = 0
        self._experts = ExpertLoadMetrics(r, m)
        self.kv_transfer = KVTransferMetrics(r, m)  # prefill/decode roles (server/disagg.py)

    def set_cache_config(self, engine_info: dict) -> None:
        """`vllm:cache_config_info` (value 1; the settings as labels, vLLM's names) from the
        engine's `describe()`: cache_dtype is --kv-cache-dtype, num_gpu_blocks the pool; also
        `cbbench:max_num_seqs_limit` from its starting value until the first step sets it."""
        labels = {
            "block_size": engine_info.get("block_size"),
            "cache_dtype": engine_info.get("kv_cache_dtype", "auto"),
            "enable_prefix_caching": engine_info.get("enable_prefix_caching"),
            "num_gpu_blocks": engine_info.get("num_kv_blocks"),
        }
        info = Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
            list(labels), registry=self.registry,
        )  # fmt: skip
        info.labels(*(str(v) for v in labels.values())).set(1)
        if engine_info.get("num_seqs_limit"):  # the limit before the first step
            self.num_seqs_limit.set(engine_info["num_seqs_limit"])

    def update_stats(self, stats: EngineStats) -> None:
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        self.batch_occupancy.set(stats.batch_occupancy)
        self.kv_reserved_unused.set(stats.kv_reserved_unused_tokens)
        if stats.num_seqs_limit:  # 0: no step yet
            self.num_seqs_limit.set(stats.num_seqs_limit)
        for d, total in (("up", stats.num_seqs_limit_ups), ("down", stats.num_seqs_limit_downs)):
            if total > self._limit_changes_seen[d]:
                self.limit_changes[d].inc(total - self._limit_changes_seen[d])
                self._limit_changes_seen[d] = total
        if stats.num_preempted_total > self._preempted_seen:
            self.preemptions.inc(stats.num_preempted_total - self._preempted_seen)
            self._preempted_seen = stats.num_preempted_total
        if stats.spec_decode is not None:
            self._update_spec(stats.spec_decode)
        if stats.expert_load is not None:
            self._experts.update(stats.expert_load)
        if stats.num_steps > self._steps_seen:  # a new step: observe its timings once
            self._steps_seen = stats.num_steps
            self.scheduler_time.observe(stats.scheduler_time_s)
            if stats.step_gap_s is not None:
                self.step_gap.observe(stats.step_gap_s)

    def _update_spec(self, s: SpecDecodeStats) -> None:
        """Counters advance by the engine's cumulative counts since the last update."""
        seen = self._spec_seen or SpecDecodeStats(s.num_spec_tokens)
        self.spec_drafts.inc(s.num_drafts - seen.num_drafts)
        self.spec_draft_tokens.inc(s.num_draft_tokens - seen.num_draft_tokens)
        self.spec_accepted_tokens.inc(s.num_accepted_tokens - seen.num_accepted_tokens)
        for pos, (now, before) in enumerate(
            zip(s.accepted_per_pos, seen.accepted_per_pos, strict=True)
        ):
            self.spec_accepted_per_pos.labels(self._model, str(pos)).inc(now - before)
        self._spec_seen = s.snapshot()

    def observe_output(self, out: RequestOutput, now: float, last_token_time: float | None) -> None:
        """`now`: engine clock when the output was produced; `last_token_time`: when this
        request's previous tokens were, None before its first."""
        n = len(out.new_token_ids)
        m = out.metrics
        if n:
            self.generation_tokens.inc(n)
            if last_token_time is None:
                self.prompt_tokens.inc(out.num_prompt_tokens)
                self.prefix_cache_queries.inc(out.num_prompt_tokens)
                self.prefix_cache_hits.inc(m.num_cached_tokens)
                first = m.first_token_time if m.first_token_time is not None else now
                self.ttft.observe(max(0.0, first - m.arrival_time))
                if m.queue_time is not None:
                    self.queue_time.observe(max(0.0, m.queue_time))
            else:
                gap = max(0.0, now - last_token_time) / n
                for _ in range(n):
                    self.itl.observe(gap)
        if out.finished and out.finish_reason != "abort":
            end = m.finished_time if m.finished_time is not None else now
            self.e2e.observe(max(0.0, end - m.arrival_time))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ExpertLoadMetrics:
    """MoE models: `cbbench:expert_tokens_total{layer,expert}` (tokens routed, counters fed
    by the engine's cumulative counts) and the load imbalance per layer (max / mean tokens
    per expert: 1 = balanced, E / k = every token of the window on the same k experts) over
    the last step that routed tokens and over all steps since the start."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = ["model_name", "layer"]
        self._model = model_name
        self.tokens = Counter(
            "cbbench:expert_tokens",
            "Tokens routed to each expert (MoE models), per layer.",
            [*labels, "expert"],
            registry=registry,
        )
        self.imbalance = Gauge(
            "cbbench:expert_load_imbalance",
            "Max / mean tokens per expert of a layer in the last step (1 = balanced).",
            labels,
            registry=registry,
        )
        self.imbalance_cumulative = Gauge(
            "cbbench:expert_load_imbalance_cumulative",
            "Max / mean tokens per expert of a layer since the start (1 = balanced).",
            labels,
            registry=registry,
        )
        self._seen: list[list[int]] = []

    def update(self, load: list[list[int]]) -> None:
        if not self._seen:  # every (layer, expert) series exists from the first stats on
            self._seen = [[0] * len(row) for row in load]
            for layer, row in enumerate(load):
                for e in range(len(row)):
                    self.tokens.labels(self._model, str(layer), str(e))
        for layer, (row, seen) in enumerate(zip(load, self._seen, strict=True)):
            if not row:
                continue  # a dense layer
            delta = [now - before for now, before in zip(row, seen, strict=True)]
            if not any(delta):
                continue
            for e, d in enumerate(delta):
                if d:
                    self.tokens.labels(self._model, str(layer), str(e)).inc(d)
            self.imbalance.labels(self._model, str(layer)).set(imbalance(delta))
            self.imbalance_cumulative.labels(self._model, str(layer)).set(imbalance(row))
            self._seen[layer] = list(row)


def imbalance(counts: list[int]) -> float:
    """max / mean of per-expert token counts (1.0 when nothing was routed)."""
    total = sum(counts)
    return max(counts) * len(counts) / total if total else 1.0
