"""What a server says about itself, for run.json's `environment.server`: enough to repeat a run.

- vLLM: `/version`, the `vllm:cache_config_info` gauge's labels on `/metrics` (block size,
  GPU memory utilization, KV blocks, prefix caching, ...), the model card of `/v1/models`.
- SGLang: `/server_info`, else `/get_server_info` (older): its whole server args and version.
- cbbench's reference engine: the `cbbench` block of `/v1/models` (its whole config).
Each look-up is one bounded GET; what a server does not answer is left out, never guessed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
from urllib.parse import urlsplit

import httpx

TIMEOUT_S = 3.0
_INFO_LINE = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def same_host(base_url: str) -> bool:
    """Whether the server runs on this host (loopback or one of its own names)."""
    host = urlsplit(base_url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    return host in ("localhost", socket.gethostname(), socket.getfqdn())


def _get(base_url: str, path: str, headers: dict, *fallbacks: str) -> httpx.Response | None:
    """One bounded GET; the next of `fallbacks` only after a 404 (an older server's path)."""
    for p in (path, *fallbacks):
        try:
            r = httpx.get(
                base_url.rstrip("/") + p, headers=headers, timeout=TIMEOUT_S, trust_env=False
            )
        except httpx.HTTPError:
            return None
        if r.status_code != 404:
            return r if r.status_code == 200 else None
    return None


def cache_config_info(metrics_text: str) -> dict | None:
    """vLLM's `vllm:cache_config_info` labels (an info gauge: value 1, settings as labels)."""
    for line in metrics_text.splitlines():
        m = _INFO_LINE.match(line)
        if m:
            return {k: v for k, v in _LABEL.findall(m.group("labels")) if k != "model_name"}
    return None


def _kind(engine: dict) -> str | None:
    if "cbbench" in engine:
        return "cbbench"
    owner = str(engine.get("owned_by") or "").lower()
    server = str(engine.get("server") or "").lower()
    for name in ("vllm", "sglang"):
        if name in owner or name in server:
            return name
    return None


def server_identity(base_url: str, engine: dict, api_key: str | None = None) -> dict:
    """`engine`: what `probe_server` read from /v1/models."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    kind = _kind(engine)
    out: dict = {
        "name": kind or engine.get("owned_by") or "unknown",
        "same_host": same_host(base_url),
    }
    out["model_card"] = {k: v for k, v in engine.items() if k not in ("cbbench", "models")}
    if kind == "cbbench":
        info = engine["cbbench"]
        out["version"] = info.get("version")
        out["config"] = info.get("config") or info
        return out
    if kind == "vllm":
        r = _get(base_url, "/version", headers)
        if r is not None:
            with contextlib.suppress(ValueError, AttributeError):
                out["version"] = r.json().get("version")
        r = _get(base_url, "/metrics", headers)
        info = cache_config_info(r.text) if r is not None else None
        if info:
            out["cache_config_info"] = info
    elif kind == "sglang":  # newer servers: /server_info (/get_server_info deprecated)
        r = _get(base_url, "/server_info", headers, "/get_server_info")
        if r is not None:
            try:
                data = r.json()
            except ValueError:
                data = None
            if isinstance(data, dict):
                out["version"] = data.get("version")
                out["server_info"] = data
    return out
