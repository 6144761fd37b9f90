"""The server's batching settings, as far as it says them, for run.json
(`target.server_settings`): what `cbbench calibrate --from-run` replays a run with.

Sources: the reference engine's `/v1/models` card (`cbbench`: every setting, its engine's
torch threads too), vLLM's `vllm:cache_config_info` metric (block size, KV blocks, prefix
caching: labels of a gauge set to 1), `/v1/models`' max_model_len, and vLLM's development
endpoint `/server_info` (only with `VLLM_SERVER_DEV_MODE=1`: its scheduler config and the
`VLLM_CPU_OMP_THREADS_BIND` it runs with). Without that endpoint a vLLM server's max_num_seqs,
token budget and threads are not told: they stay out of run.json (unknown), and
`calibrate --server-config` gives them. SGLang (/server_info), TGI (/info) and llama.cpp
(/props): harness/telemetry/foreign_settings.py.
"""

from __future__ import annotations

import re

from cbbench.harness.telemetry.foreign_settings import ENDPOINTS, server_kind

_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_BOOL = {"true": True, "false": False, "1": True, "0": False}


def _value(text: str):
    if text.lower() in _BOOL:
        return _BOOL[text.lower()]
    try:
        return int(text)
    except ValueError:
        return None


def from_metrics(text: str) -> dict:
    """Settings from a Prometheus exposition's `vllm:cache_config_info` (empty if absent)."""
    m = _INFO.search(text)
    if m is None:
        return {}
    labels = dict(_LABEL.findall(m.group(1)))
    out = {}
    for label, key in (("block_size", "block_size"), ("num_gpu_blocks", "num_kv_blocks"),
                       ("enable_prefix_caching", "enable_prefix_caching")):  # fmt: skip
        v = _value(labels.get(label, ""))
        if v is not None and v != "":
            out[key] = v
    return out


def from_models(engine: dict) -> dict:
    """Settings from the /v1/models probe (harness/client/api.probe_server)."""
    out = {}
    if isinstance(engine.get("max_model_len"), int):
        out["max_model_len"] = engine["max_model_len"]
    info = engine.get("cbbench")
    if isinstance(info, dict):
        for src, key in (("num_seqs_limit", "max_num_seqs"),
                         ("max_num_batched_tokens", "max_num_batched_tokens"),
                         ("enable_chunked_prefill", "enable_chunked_prefill"),
                         ("block_size", "block_size"), ("num_kv_blocks", "num_kv_blocks"),
                         ("enable_prefix_caching", "enable_prefix_caching"),
                         ("cpu_threads", "cpu_threads"),
                         ("kv_cache_dtype", "kv_cache_dtype")):  # fmt: skip
            if info.get(src) is not None:
                out[key] = info[src]
    return out


def from_server_info(data: object) -> dict:
    """Settings from vLLM's `/server_info?config_format=json` (dev mode): `vllm_config` is its
    VllmConfig as JSON, `vllm_env` the VLLM_* variables it reads (empty if not that shape)."""
    if not isinstance(data, dict) or not isinstance(data.get("vllm_config"), dict):
        return {}
    config, env = data["vllm_config"], data.get("vllm_env")
    out = {}
    sched = config.get("scheduler_config")
    if isinstance(sched, dict):
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            if isinstance(sched.get(key), int) and not isinstance(sched.get(key), bool):
                out[key] = sched[key]
        if isinstance(sched.get("enable_chunked_prefill"), bool):
            out["enable_chunked_prefill"] = sched["enable_chunked_prefill"]
    cache = config.get("cache_config")
    if isinstance(cache, dict) and isinstance(cache.get("enable_prefix_caching"), bool):
        out["enable_prefix_caching"] = cache["enable_prefix_caching"]
    if isinstance(cache, dict) and isinstance(cache.get("cache_dtype"), str):
        out["kv_cache_dtype"] = cache["cache_dtype"]
    par = config.get("parallel_config")
    if isinstance(par, dict) and isinstance(par.get("tensor_parallel_size"), int):
        out["tensor_parallel_size"] = par["tensor_parallel_size"]
    if isinstance(env, dict) and env.get("VLLM_CPU_OMP_THREADS_BIND") is not None:
        out["cpu_threads_bind"] = str(env["VLLM_CPU_OMP_THREADS_BIND"])
    return out


def _foreign(kind: str, base_url: str, api_key: str | None, timeout_s: float) -> dict:
    """SGLang's, TGI's or llama.cpp's own settings endpoint (foreign_settings.ENDPOINTS): one
    bounded GET each, the next path only after a 404; junk or no answer: nothing."""
    import httpx

    paths, parse = ENDPOINTS[kind]
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    root = base_url.rstrip("/").removesuffix("/v1")
    for path in paths:
        try:
            resp = httpx.get(f"{root}{path}", headers=headers, timeout=timeout_s, trust_env=False)
        except httpx.HTTPError:
            return {}
        if resp.status_code == 404:
            continue
        if resp.status_code != 200:
            return {}
        try:
            return parse(resp.json())
        except ValueError:
            return {}
    return {}


def read_server_settings(
    metrics_url: str | None,
    engine: dict,
    timeout_s: float = 5.0,
    base_url: str | None = None,
    api_key: str | None = None,
    read: dict | None = None,
) -> dict:
    """/v1/models' settings, then (with `base_url`) a vLLM server's /server_info or SGLang's,
    TGI's or llama.cpp's settings endpoint, then /metrics': each one bounded GET;
    unreachable, absent (404) or junk: skipped. `read`: the settings endpoint's answer where
    the caller has it already (the run's environment.server asked SGLang): not asked again."""
    import httpx

    out = from_models(engine)
    if base_url and "vllm" in str(engine.get("owned_by") or "").lower():
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        root = base_url.rstrip("/").removesuffix("/v1")
        try:
            resp = httpx.get(f"{root}/server_info", params={"config_format": "json"},
                             headers=headers, timeout=timeout_s, trust_env=False)  # fmt: skip
            if resp.status_code == 200:
                out.update({k: v for k, v in from_server_info(resp.json()).items()
                            if k not in out})  # fmt: skip
        except (httpx.HTTPError, ValueError):
            pass
    kind = server_kind(engine)
    if kind in ENDPOINTS and (base_url or read is not None):
        told = (ENDPOINTS[kind][1](read) if read is not None
                else _foreign(kind, base_url or "", api_key, timeout_s))  # fmt: skip
        out.update({k: v for k, v in told.items() if k not in out})
    if metrics_url:
        try:
            resp = httpx.get(metrics_url, timeout=timeout_s, trust_env=False)
            if resp.status_code == 200:
                out.update({k: v for k, v in from_metrics(resp.text).items() if k not in out})
        except httpx.HTTPError:
            pass
    return out
