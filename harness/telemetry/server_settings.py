"""The server's batching settings, as far as it says them, for run.json
(`target.server_settings`): what `cbbench calibrate --from-run` replays a run with.

Sources: the reference engine's `/v1/models` card (`cbbench`: every setting), vLLM's
`vllm:cache_config_info` metric (block size, KV blocks, prefix caching: labels of a gauge
set to 1), and `/v1/models`' max_model_len. max_num_seqs and the token budget of a vLLM
server are not exposed: `calibrate --server-config` gives them.
"""

from __future__ import annotations

import re

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
                         ("enable_prefix_caching", "enable_prefix_caching")):  # fmt: skip
            if info.get(src) is not None:
                out[key] = info[src]
    return out


def read_server_settings(metrics_url: str | None, engine: dict, timeout_s: float = 5.0) -> dict:
    """/v1/models' settings, then /metrics' (one bounded GET; unreachable: skipped)."""
    import httpx

    out = from_models(engine)
    if metrics_url:
        try:
            resp = httpx.get(metrics_url, timeout=timeout_s, trust_env=False)
            if resp.status_code == 200:
                out.update({k: v for k, v in from_metrics(resp.text).items() if k not in out})
        except httpx.HTTPError:
            pass
    return out
