"""What SGLang, TGI and llama.cpp say about their batching settings, in cbbench's names
(`target.server_settings`, read by harness/telemetry/server_settings.py).

A setting that means what a cbbench/vLLM setting means takes that name (max_num_seqs,
max_num_batched_tokens, enable_chunked_prefill, enable_prefix_caching, block_size,
num_kv_blocks, max_model_len, tensor_parallel_size, kv_cache_dtype); the rest keep the
server's own name (`OWN`). What a server does not say is left out: "unknown" where two runs
meet (results/comparability.py), never guessed.

- SGLang `/server_info` (newer) or `/get_server_info`: its ServerArgs as a dict, the
  scheduler's info (max_total_num_tokens, ...), `internal_states` (one per DP rank: newer
  servers put effective_max_running_requests_per_dp and memory_usage.token_capacity there)
  and `version` (python/sglang/srt/entrypoints/http_server.py; the native-API docs' example).
- TGI `/info`: its router's `Info` (router/src/lib.rs, served by router/src/server.rs);
  batch limits only in versions before the v3 backend moved them out of the router.
- llama.cpp `/props`: `total_slots` (its `--parallel`), `default_generation_settings.n_ctx`
  (each slot's context) (tools/server/server-context.cpp, `get_props`).
"""

from __future__ import annotations

# the server's own names kept as they are: they move step times but have no cbbench twin
OWN = {
    "sglang": ("schedule_policy", "chunked_prefill_size", "max_prefill_tokens", "dp_size",
               "pp_size", "max_total_num_tokens", "mem_fraction_static", "attention_backend",
               "cuda_graph_max_bs"),  # fmt: skip
    "tgi": ("max_concurrent_requests", "max_batch_total_tokens", "max_waiting_tokens",
            "waiting_served_ratio", "max_input_tokens", "max_client_batch_size"),  # fmt: skip
    "llamacpp": (),  # total_slots is max_num_seqs
}


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _own(kind: str, data: dict) -> dict:
    return {k: data[k] for k in OWN[kind]
            if isinstance(data.get(k), (int, float, str, bool)) and data.get(k) != ""}  # fmt: skip


def from_sglang(data: object) -> dict:
    """SGLang's server info: the running-requests cap is max_num_seqs (`internal_states`'
    effective_max_running_requests_per_dp, as newer servers report it, else the
    max_running_requests argument); chunked_prefill_size > 0
    is chunked prefill on (-1 or 0: off), and a step's prefill tokens are held under both it
    and max_prefill_tokens (its PrefillAdder), so their minimum is max_num_batched_tokens;
    the radix cache is prefix caching; page_size is block_size; its KV pool of
    max_total_num_tokens tokens is num_kv_blocks pages."""
    if not isinstance(data, dict) or not any(k in data for k in ("tp_size", "model_path")):
        return {}
    out = {}
    states = data.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    # the cap the scheduler runs with (resolved where the argument is left to auto), per DP
    # rank; else the argument itself, which is per engine only without data parallelism
    per_rank = _int(state.get("effective_max_running_requests_per_dp"))
    given = _int(data.get("max_running_requests")) if data.get("dp_size") in (None, 1) else None
    if (v := per_rank if per_rank is not None else given) is not None:
        out["max_num_seqs"] = v
    chunk, prefill = _int(data.get("chunked_prefill_size")), _int(data.get("max_prefill_tokens"))
    if chunk is not None:
        out["enable_chunked_prefill"] = chunk > 0
    budgets = [b for b in (chunk if chunk and chunk > 0 else None, prefill) if b]
    if budgets:
        out["max_num_batched_tokens"] = min(budgets)
    if isinstance(data.get("disable_radix_cache"), bool):
        out["enable_prefix_caching"] = not data["disable_radix_cache"]
    if (v := _int(data.get("page_size"))) is not None and v > 0:
        out["block_size"] = v
        memory = state.get("memory_usage") if isinstance(state.get("memory_usage"), dict) else {}
        pool = _int(data.get("max_total_num_tokens")) or _int(memory.get("token_capacity"))
        if pool is not None:
            out["num_kv_blocks"] = pool // v
    if (v := _int(data.get("context_length"))) is not None:
        out["max_model_len"] = v
    if (v := _int(data.get("tp_size"))) is not None:
        out["tensor_parallel_size"] = v
    if isinstance(data.get("kv_cache_dtype"), str):
        out["kv_cache_dtype"] = data["kv_cache_dtype"]
    return {**out, **_own("sglang", data)}


def from_tgi(data: object) -> dict:
    """TGI's /info: max_batch_size (when set) is max_num_seqs, max_total_tokens (prompt +
    output of one request) is max_model_len; the rest keep TGI's names. /info tells neither
    max_batch_prefill_tokens nor the shard count: unknown."""
    if not isinstance(data, dict) or "max_concurrent_requests" not in data:
        return {}
    out = {}
    if (v := _int(data.get("max_batch_size"))) is not None:
        out["max_num_seqs"] = v
    if (v := _int(data.get("max_total_tokens"))) is not None:
        out["max_model_len"] = v
    if "max_input_tokens" not in data and _int(data.get("max_input_length")) is not None:
        data = {**data, "max_input_tokens": data["max_input_length"]}  # before TGI 2.0
    return {**out, **_own("tgi", data)}


def from_llamacpp(data: object) -> dict:
    """llama.cpp's /props: total_slots (requests decoded at once) is max_num_seqs; a slot's
    n_ctx (the context each request gets) is max_model_len."""
    if not isinstance(data, dict) or "default_generation_settings" not in data:
        return {}
    out = {}
    if (v := _int(data.get("total_slots"))) is not None:
        out["max_num_seqs"] = v
    gen = data.get("default_generation_settings")
    if isinstance(gen, dict) and (v := _int(gen.get("n_ctx"))) is not None:
        out["max_model_len"] = v
    return {**out, **_own("llamacpp", data)}


# kind -> (paths tried in order, the next only when one answers 404; parser)
ENDPOINTS = {
    "sglang": (("/server_info", "/get_server_info"), from_sglang),
    "tgi": (("/info",), from_tgi),
    "llamacpp": (("/props",), from_llamacpp),
}


def server_kind(engine: dict) -> str | None:
    """sglang, tgi, llamacpp or None, from the /v1/models probe: SGLang's cards say
    owned_by "sglang", llama.cpp's "llamacpp"; TGI's card is owned by the model id itself."""
    owner = str(engine.get("owned_by") or "").lower()
    server = str(engine.get("server") or "").lower()
    if "sglang" in owner or "sglang" in server:
        return "sglang"
    if "llamacpp" in owner or "llama.cpp" in server:
        return "llamacpp"
    models = engine.get("models") or []
    if owner and models and engine.get("owned_by") == models[0] and "cbbench" not in engine:
        return "tgi"
    return None
