"""The fix for each symptom in each engine's own flags. Flag names as each project documents
them at the time of writing; check your version's docs before a deploy (names change)."""

from __future__ import annotations

FIXES: dict[str, dict[str, str]] = {
    "session-cache": {
        "vllm": "keep automatic prefix caching on (--enable-prefix-caching, the V1 default; "
        "drop --no-enable-prefix-caching); more KV memory (--gpu-memory-utilization) keeps "
        "histories cached across think times",
        "sglang": "keep RadixAttention on (drop --disable-radix-cache); raise "
        "--mem-fraction-static so histories survive between turns",
        "tgi": "keep prefix caching on (PREFIX_CACHING=1, the TGI 3 default)",
        "triton": "TensorRT-LLM backend: enable_kv_cache_reuse: true (and paged KV cache)",
        "cbbench": "cbbench serve --enable-prefix-caching (continuous scheduler); more "
        "--num-kv-blocks keeps histories cached between turns",
    },
    "agent-cache": {
        "vllm": "keep automatic prefix caching on (drop --no-enable-prefix-caching); behind "
        "vLLM production-stack route by session (--routing-logic session --session-key "
        "x-session-id) or prefix; more --gpu-memory-utilization keeps histories through tool "
        "waits",
        "sglang": "keep RadixAttention on (drop --disable-radix-cache); sglang-router "
        "--policy cache_aware (or consistent_hashing on the session header); raise "
        "--mem-fraction-static",
        "tgi": "keep prefix caching on (PREFIX_CACHING=1); one replica per session behind a "
        "sticky load balancer",
        "triton": "TensorRT-LLM backend: enable_kv_cache_reuse: true; sticky routing per session",
        "cbbench": "cbbench serve --enable-prefix-caching; with replicas --router "
        "session-affinity or prefix-affinity; more --num-kv-blocks for long tool waits",
    },
    "fanout-queue": {
        "vllm": "a larger --max-num-batched-tokens (chunked prefill packs several siblings' "
        "prompts into one step) and enough --max-num-seqs; keep prefix caching on so the "
        "siblings' shared history is prefilled once",
        "sglang": "raise --chunked-prefill-size and --max-prefill-tokens; --schedule-policy lpm "
        "keeps siblings with a shared prefix together",
        "tgi": "raise --max-batch-prefill-tokens so a burst prefills in one batch",
        "triton": "TensorRT-LLM: raise max_num_tokens; enable_kv_cache_reuse for the shared "
        "history",
        "cbbench": "cbbench serve --max-num-batched-tokens larger, --enable-prefix-caching; "
        "bench --concurrency at least the fan-out width",
    },
    "errors": {
        "vllm": "HTTP 400: prompt + max_tokens over --max-model-len (raise it or cap requests); "
        "timeouts: offer less load or raise the client timeout; connection errors: check "
        "the server log (OOM, crash) and --max-num-seqs",
        "sglang": "HTTP 400: over --context-length; load shedding: raise --max-queued-requests "
        "or offer less load",
        "tgi": "HTTP 429 'Model is overloaded': raise --max-concurrent-requests or offer less "
        "load; 422: over --max-input-tokens / --max-total-tokens",
        "triton": "queue full: raise dynamic_batching { default_queue_policy { max_queue_size } }"
        " or offer less load; timeouts: default_timeout_microseconds",
        "cbbench": "HTTP 429: raise cbbench serve --max-waiting / --max-queue-size or offer less "
        "load; 400: over --max-model-len; timeouts: cbbench bench --timeout",
    },
    # the errors rule picks these by the failures' kind (harness/diagnose/rules/errors.py)
    "errors-connection": {
        "vllm": "connections refused or cut: the server stopped or crashed; its log says why "
        "(CUDA OOM: lower --gpu-memory-utilization or --max-num-seqs); restart it and rerun",
        "sglang": "connections refused or cut: the server stopped or crashed; check its log "
        "(OOM: lower --mem-fraction-static or --max-running-requests)",
        "tgi": "connections refused or cut: the server stopped or crashed; check its log "
        "(OOM: lower --max-batch-total-tokens)",
        "triton": "connections refused or cut: the server stopped or crashed; check its log "
        "and the model's instance count",
        "cbbench": "connections refused or cut: the server stopped or crashed; its log says "
        "why (the process exited, was killed, or ran out of memory); restart it and rerun",
    },
    "errors-shed": {
        "vllm": "HTTP 429/503 from a gateway in front of vLLM: raise its limits or offer less load",
        "sglang": "load shedding: raise --max-queued-requests or offer less load",
        "tgi": "HTTP 429 'Model is overloaded': raise --max-concurrent-requests or offer less load",
        "triton": "queue full: raise dynamic_batching { default_queue_policy { max_queue_size } }"
        " or offer less load",
        "cbbench": "HTTP 429: raise cbbench serve --max-waiting / --max-queue-size or offer less "
        "load",
    },
    "errors-context": {
        "vllm": "HTTP 400: prompt + max_tokens over --max-model-len (raise it or cap requests)",
        "sglang": "HTTP 400: over --context-length (raise it or cap requests)",
        "tgi": "HTTP 422: over --max-input-tokens / --max-total-tokens",
        "triton": "inputs over the engine's max_input_len / max_seq_len: rebuild the engine or "
        "cap requests",
        "cbbench": "HTTP 400: over cbbench serve --max-model-len (raise it or cap requests)",
    },
    "errors-timeout": {
        "vllm": "timeouts: offer less load or raise the client timeout (cbbench bench --timeout)",
        "sglang": "timeouts: offer less load or raise the client timeout",
        "tgi": "timeouts: offer less load or raise the client timeout",
        "triton": "timeouts: default_timeout_microseconds, or offer less load",
        "cbbench": "timeouts: cbbench bench --timeout, or offer less load",
    },
    "kv-pressure": {
        "vllm": "lower --max-num-seqs or --max-model-len; raise --gpu-memory-utilization "
        "(e.g. 0.9); more/larger GPUs (--tensor-parallel-size); --kv-cache-dtype fp8",
        "sglang": "lower --max-running-requests or --context-length; raise --mem-fraction-static",
        "tgi": "lower --max-batch-total-tokens / --max-total-tokens; raise --cuda-memory-fraction",
        "triton": "TensorRT-LLM backend: lower max_batch_size / max_tokens_in_paged_kv_cache; "
        "raise kv_cache_free_gpu_mem_fraction",
        "cbbench": "cbbench serve: lower --max-num-seqs or --max-model-len; raise "
        "--num-kv-blocks / --kv-cache-memory-gb",
    },
    "low-concurrency": {
        "vllm": "the server was idle: offer more load (client --concurrency / --rate); "
        "check the client is not capped (cbbench bench --concurrency)",
        "sglang": "offer more load (more concurrent requests); nothing to change on the server",
        "tgi": "offer more load (more concurrent requests); nothing to change on the server",
        "triton": "offer more load; in perf_analyzer raise --concurrency-range",
        "cbbench": "cbbench bench: raise --concurrency or --rate (the server had room)",
    },
    "batch-cap": {
        "vllm": "raise --max-num-seqs (and --max-num-batched-tokens) while KV usage stays low",
        "sglang": "raise --max-running-requests",
        "tgi": "raise --max-batch-size / --max-batch-total-tokens",
        "triton": "raise max_batch_size (and preferred_batch_size) in config.pbtxt",
        "cbbench": "cbbench serve: raise --max-num-seqs (continuous) or --batch-size / "
        "--max-batch-size (static / dynamic)",
    },
    "hol-blocking": {
        "vllm": "vLLM already batches per iteration (continuous batching): if seen there, "
        "lower --max-model-len or cap max_tokens of long requests",
        "sglang": "SGLang batches per iteration; cap --context-length or long requests' max_tokens",
        "tgi": "TGI batches per iteration; lower --max-total-tokens for long requests",
        "triton": "request-level dynamic_batching holds short requests behind long ones: serve "
        "LLMs through the TensorRT-LLM/vLLM backend with in-flight (continuous) batching "
        "(batching_strategy: inflight_fused_batching)",
        "cbbench": "cbbench serve --scheduler continuous (continuous batching: a finished "
        "request's slot is refilled at the next step); or a smaller --max-model-len (static "
        "reserves it for every slot) / cap long requests' max_tokens",
    },
    "reasoning-wait": {
        "vllm": "per request: reasoning_effort \"low\" (gpt-oss), chat_template_kwargs "
        "{\"enable_thinking\": false} (Qwen3, DeepSeek-V3.1 hybrid: \"thinking\"), or a smaller "
        "max_tokens as a thinking budget (cbbench bench --reasoning-effort / "
        "--chat-template-kwargs send them)",
        "sglang": "per request: chat_template_kwargs {\"enable_thinking\": false} (Qwen3) or "
        "reasoning_effort (gpt-oss); cap max_tokens as a thinking budget",
        "tgi": "TGI streams the thinking inline: use the model's non-thinking template "
        "(enable_thinking false) or cap max_tokens",
        "triton": "TensorRT-LLM: a non-thinking chat template, or cap max_tokens",
        "cbbench": "cbbench serve: a lower --reasoning-share; per request reasoning_effort "
        "\"low\" or chat_template_kwargs {\"enable_thinking\": false}",
    },
    "queue-delay": {
        "vllm": "vLLM has no batching delay: if queue time dominates, the server is full; see "
        "--max-num-seqs",
        "sglang": "SGLang has no batching delay: a long queue means a full server "
        "(--max-running-requests)",
        "tgi": "lower --waiting-served-ratio / --max-waiting-tokens so queued requests join sooner",
        "triton": "lower dynamic_batching { max_queue_delay_microseconds } (and the "
        "preferred_batch_size you wait for) in config.pbtxt",
        "cbbench": "cbbench serve --scheduler dynamic: lower --max-queue-delay or the "
        "--preferred-batch-sizes it waits for; or --scheduler continuous",
    },
    "prefill-stall": {
        "vllm": "lower --max-num-batched-tokens (e.g. 512-2048) so long prompts are split into "
        "smaller chunks (chunked prefill is on by default in the V1 engine; on V0 add "
        "--enable-chunked-prefill)",
        "sglang": "--chunked-prefill-size 2048 (or smaller); --schedule-conservativeness",
        "tgi": "lower --max-batch-prefill-tokens; --waiting-served-ratio to admit fewer prefills",
        "triton": "TensorRT-LLM backend: enable_chunked_context: true; lower max_num_tokens",
        "cbbench": "cbbench serve --max-num-batched-tokens 256 (chunked prefill is on by "
        "default: a smaller step budget splits prompts finer); --max-prefills-per-step 1",
    },
    "pd-interference": {
        "vllm": "disaggregate: prefill and decode instances with --kv-transfer-config "
        "'{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}' behind vLLM's "
        "disaggregated proxy (or llm-d's P/D; Dynamo: prefill workers `python -m dynamo.vllm "
        "--is-prefill-worker` beside the decode workers); else chunk finer: lower "
        "--max-num-batched-tokens (chunked prefill is on in V1)",
        "sglang": "--disaggregation-mode prefill / decode workers (--disaggregation-"
        "transfer-backend mooncake|nixl) behind sglang-router --pd-disaggregation; else "
        "--chunked-prefill-size 512",
        "tgi": "no P/D mode: lower --max-batch-prefill-tokens; route long prompts to their own "
        "replicas",
        "triton": "TensorRT-LLM disaggregated serving (context and generation servers, "
        "trtllm-serve disaggregated); else enable_chunked_context with a smaller max_num_tokens",
        "cbbench": "cbbench serve --prefill-replicas 1 --decode-replicas 1 (`cbbench plan "
        "--space 'mode=aggregated,disaggregated;prefill=1..;decode=1..'` sizes P:D); else "
        "--max-num-batched-tokens 128 (chunk finer)",
    },
    "length-skew": {
        "vllm": "cap --max-model-len; reject or truncate over-long prompts at the gateway; "
        "give long requests a lower priority (--scheduling-policy priority)",
        "sglang": "cap --context-length; --schedule-policy lpm/fcfs; lower priority for long ones",
        "tgi": "cap --max-input-tokens / --max-total-tokens",
        "triton": "cap the input length in the ensemble/preprocessing; separate model instances "
        "for long requests",
        "cbbench": "cbbench serve: cap --max-model-len; --policy priority with long requests at a "
        "lower priority (aging keeps them from starving)",
    },
    "scheduling-delay": {
        "vllm": "--async-scheduling (overlaps scheduling and output processing with the "
        "forward pass); keep the V1 engine core in its own process",
        "sglang": "keep the overlap scheduler on (drop --disable-overlap-schedule)",
        "tgi": "the Rust router schedules between steps: lower --max-batch-size if the gap grows "
        "with the batch; newer TGI releases overlap more of it",
        "triton": "TensorRT-LLM backend: in-flight batching schedules in C++; lower "
        "max_batch_size if host time grows with it",
        "cbbench": "cbbench serve --async-scheduling (the next step is built while this one "
        "computes); keep the engine process (drop --no-engine-process); a lower "
        "--max-num-seqs if scheduler time grows with running sequences",
    },
    "client-bound": {
        "vllm": "the numbers are the client's: rerun with more load-generator processes or on "
        "another machine (vllm bench serve: one process, so lower --request-rate)",
        "sglang": "the numbers are the client's: rerun the load generator on another machine",
        "tgi": "the numbers are the client's: rerun the load generator on another machine",
        "triton": "perf_analyzer: more --concurrency workers or another machine",
        "cbbench": "cbbench bench --workers N (one process per core), --http-client raw, fewer "
        "other jobs on the client machine, or a lower --rate",
    },
}


def fixes_for(rule: str) -> dict[str, str]:
    return dict(FIXES[rule])
