"""One comparison table for runs side by side (`cbbench run`, `cbbench sim`), from the one
summary type (`summary.summarize`): one column per run, throughput, latency percentiles,
queue time, batch occupancy and KV usage; ratios against the `static` column. TTFO (first
answer token) rows join TTFT's when a run reasoned (`reasoned`); for plain runs TTFO is TTFT,
and the rows are left out. Runs with a
`kv_pool` (`cbbench run`: `kv_pool(run.json)`) add the KV dtype, the pool's blocks, the
capacity in sequences (`seqs_held`), running sequences and preemptions.

Engine-side figures come from the summary's `sim` block (a replay's step statistics) or, for
runs against a server, from its scraped telemetry (`telemetry.server`).

`emit_table` prints it as a rich table on a terminal and as a Markdown table otherwise (piped
or redirected output keeps every name whole), and writes the Markdown into a folder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:,.0f}" if v >= 0.01 else f"{v * 1e3:.1f}"


def _scaled(v: float | None, by: float) -> float | None:
    return None if v is None else v * by


def _engine(s: dict, sim_key: str, server_field: str, stat: str = "mean") -> float | None:
    """A step statistic: the replay's own, else the server's scraped gauge."""
    sim = s.get("sim")
    if sim is not None:
        return sim.get(sim_key)
    server = (s.get("telemetry") or {}).get("server") or {}
    v = server.get(server_field)
    return v.get(stat) if isinstance(v, dict) else None


def _spec(s: dict, key: str) -> float | None:
    """A speculative-decoding figure: the replay's own, else the server's."""
    if s.get("sim") is not None:
        return s["sim"].get(key)
    return ((s.get("telemetry") or {}).get("server") or {}).get(key)


def _timing(s: dict, field: str, p: str) -> float | None:
    """A step timing percentile (`field`: step_gap or scheduler_time): the replay's own, else
    the server's histogram estimate."""
    if s.get("sim") is not None:
        return (s["sim"].get(f"{field}_s") or {}).get(p)
    server = (s.get("telemetry") or {}).get("server") or {}
    return (server.get(field) or {}).get(p)


def reasoned(s: dict) -> bool:
    """A run whose streams reasoned: reasoning tokens (the server's count, else the client's),
    bench's own rule for its TTFO rows. Not "TTFO differs from TTFT": a plain stream whose
    first tokens are blank (the tiny model's) answers a little after its first token."""
    return bool(s.get("total_reasoning_tokens"))


def seqs_held(num_blocks: int, block_size: int, seq_len: float | None) -> int | None:
    """Capacity: how many sequences of `seq_len` tokens a pool of `num_blocks` blocks of
    `block_size` tokens holds at once (each sequence takes ceil(seq_len / block_size) whole
    blocks, the block manager's rule; no prefix sharing)."""
    if not seq_len or seq_len <= 0:
        return None
    return num_blocks // -(-math.ceil(seq_len) // block_size)


def kv_pool(meta: dict, mean_len: float | None = None) -> dict | None:
    """A run's KV pool from its run.json, as the engine reported it: a served run's
    `target.engine.cbbench` (the engine's `describe()` from /v1/models), a replay's
    `num_kv_blocks` and `engine_config`. With the capacity (`seqs_held`) at the workload's mean
    request length (prompt + output, `mean_len`) and at max_model_len. None: no pool known."""
    target = meta.get("target") or {}
    info = (target.get("engine") or {}).get("cbbench") or {}
    # another server's own settings (vLLM's cache_config_info metric): its report row read
    # "KV blocks -" beside a header line that said num_gpu_blocks 2048
    served = target.get("server_settings") or {}
    cache = ((meta.get("environment") or {}).get("server") or {}).get("cache_config_info") or {}
    cfg = meta.get("engine_config") or {}
    blocks = info.get("num_kv_blocks", meta.get("num_kv_blocks")) or served.get("num_kv_blocks")
    block_size = info.get("block_size", cfg.get("block_size")) or served.get("block_size")
    if not blocks or not block_size:
        return None
    max_len = info.get("max_model_len", meta.get("max_model_len")) or served.get("max_model_len")
    kv_dtype = info.get("kv_cache_dtype", cfg.get("kv_cache_dtype", cache.get("cache_dtype")))
    return {
        "kv_cache_dtype": kv_dtype or "auto",
        "dtype": info.get("dtype", cfg.get("dtype")),  # the model's: what "auto" stores
        "num_kv_blocks": blocks,
        "block_size": block_size,
        "mean_len": mean_len,
        "max_model_len": max_len,
        "capacity": seqs_held(blocks, block_size, mean_len),
        "capacity_max_len": seqs_held(blocks, block_size, max_len),
    }


def kv_dtype_label(pool: dict | None) -> str | None:
    """`auto (bfloat16)`: the KV dtype with the model dtype that `auto` stands for, where the
    run names one (`--dtype auto` leaves the checkpoint's, so plain `auto` then)."""
    if not pool or pool.get("kv_cache_dtype") is None:
        return None
    kv, model = pool["kv_cache_dtype"], pool.get("dtype")
    return f"{kv} ({model})" if kv == "auto" and model not in (None, "auto") else str(kv)


def preemptions(s: dict) -> int | None:
    """Preemptions in the run: the replay's count, else the server's counter over the window."""
    if s.get("sim") is not None:
        return s["sim"].get("num_preemptions")
    v = ((s.get("telemetry") or {}).get("server") or {}).get("preemptions")
    return None if v is None else int(v)


def _kv_rows(summaries: dict[str, dict], row: Callable[[str, Callable[[dict], str]], None]):
    """KV dtype, pool, capacity, running sequences: for runs with a `kv_pool` (cbbench run)."""
    pools = [s.get("kv_pool") or {} for s in summaries.values()]
    lens = {p.get("mean_len") for p in pools if p}
    mean_len = f"{math.ceil(lens.pop())}" if len(lens) == 1 and None not in lens else "mean"
    row("KV cache dtype", lambda s: kv_dtype_label(s.get("kv_pool")) or "-")
    row(
        "KV blocks in the pool (x tokens)",
        lambda s: f"{p['num_kv_blocks']} x {p['block_size']}" if (p := s.get("kv_pool")) else "-",
    )
    row(
        f"capacity, seqs (of {mean_len} tok / of max_model_len)",
        lambda s: (
            f"{_f(p.get('capacity'), '{}')} / {_f(p.get('capacity_max_len'), '{}')}"
            if (p := s.get("kv_pool"))
            else "-"
        ),
    )
    row(
        "running peak / mean",
        lambda s: (
            f"{_f(_engine(s, 'num_running_max', 'running', 'max'), '{:.0f}')} / "
            f"{_f(_engine(s, 'num_running_mean', 'running'), '{:.1f}')}"
        ),
    )


def _ok_of(s: dict) -> str:
    """'256/256'; a run cut by Ctrl-C against what it planned: '89/256 (Ctrl-C)'."""
    planned = s.get("interrupted_of")
    if planned:
        return f"{s['counts']['completed']}/{planned} (Ctrl-C)"
    return f"{s['counts']['completed']}/{s['counts']['total']}"


def comparison_table(
    summaries: dict[str, dict], title: str, *, steps: bool = False, label: str = "metric"
) -> Table:
    """One column per run. `steps`: times are engine steps (hardware `steps`), not seconds."""
    t = Table(title=title, title_style="bold")
    t.add_column(label)
    for name in summaries:
        t.add_column(name, justify="right")
    base = summaries.get("static")
    unit = "steps" if steps else "s"
    lat_unit = "steps" if steps else "ms"
    lat: Callable[[float | None], str] = (lambda v: _f(v)) if steps else _ms
    any_sim = any(s.get("sim") is not None for s in summaries.values())

    def row(text: str, fn: Callable[[dict], str]) -> None:
        t.add_row(text, *[fn(s) for s in summaries.values()])

    row("requests ok / sent", _ok_of)
    if any_sim:
        row("engine steps", lambda s: str((s.get("sim") or {}).get("num_steps", "-")))
    row(f"duration ({unit})", lambda s: _f(s["duration_s"]))
    row(f"throughput (req/{unit})", lambda s: _f(s["request_throughput"], "{:.3f}"))
    row(f"throughput (output tok/{unit})", lambda s: _f(s["output_throughput"], "{:.1f}"))
    if base and base.get("output_throughput"):
        row(
            f"output tok/{unit} vs static",
            lambda s: _f((s["output_throughput"] or 0) / base["output_throughput"], "{:.2f}x"),
        )
    if any(s.get("goodput") for s in summaries.values()):
        row(
            f"goodput (req/{unit} within SLO)",
            lambda s: _f((s.get("goodput") or {}).get("requests_per_s"), "{:.3f}"),
        )
    latencies = [("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")]
    if any(reasoned(s) for s in summaries.values()):
        latencies.insert(1, ("ttfo_s", "TTFO"))
    for key, name in latencies:
        for p in ("p50", "p99"):
            row(f"{name} {p} ({lat_unit})", lambda s, key=key, p=p: lat((s.get(key) or {}).get(p)))
    if base and base["e2e_s"]["p99"]:
        row(
            "E2E p99 vs static",
            lambda s: _f((s["e2e_s"]["p99"] or 0) / base["e2e_s"]["p99"], "{:.2f}x"),
        )
    if any((s.get("server_queue_s") or {}).get("count") for s in summaries.values()):
        for p in ("p50", "p99"):
            row(f"queue {p} ({lat_unit})", lambda s, p=p: lat(s["server_queue_s"][p]))
    plain = summaries.get("continuous")
    if "continuous+spec" in summaries and plain and plain.get("output_throughput"):
        row(
            f"output tok/{unit} vs continuous",
            lambda s: _f((s["output_throughput"] or 0) / plain["output_throughput"], "{:.2f}x"),
        )
        row("spec: draft acceptance", lambda s: _f(_spec(s, "spec_acceptance_rate"), "{:.0%}"))
        row("spec: tokens per step", lambda s: _f(_spec(s, "spec_mean_accepted_length")))
    row(
        "batch occupancy (mean)",
        lambda s: _f(_engine(s, "batch_occupancy_mean", "batch_occupancy"), "{:.0%}"),
    )
    row(
        "KV usage mean / max",
        lambda s: (
            f"{_f(_engine(s, 'kv_usage_mean', 'kv_usage'), '{:.0%}')} / "
            f"{_f(_engine(s, 'kv_usage_max', 'kv_usage', 'max'), '{:.0%}')}"
        ),
    )
    any_pool = any(s.get("kv_pool") for s in summaries.values())
    if any_pool:
        _kv_rows(summaries, row)
    if any_sim or any_pool:
        row("preemptions", lambda s: _f(preemptions(s), "{}"))
    if any_sim:
        row(
            "KV reserved, unused (tokens, mean)",
            lambda s: _f((s.get("sim") or {}).get("kv_reserved_unused_tokens_mean"), "{:.0f}"),
        )
        row(
            "running mean / limit mean",
            lambda s: (
                f"{_f((s.get('sim') or {}).get('num_running_mean'), '{:.1f}')} / "
                f"{_f((s.get('sim') or {}).get('num_seqs_limit_mean'), '{:.1f}')}"
            ),
        )
        row(
            "prompt tokens from prefix cache",
            lambda s: _f((s.get("sim") or {}).get("prefix_cache_hit_rate"), "{:.0%}"),
        )
    if any(_timing(s, "scheduler_time", "p50") is not None for s in summaries.values()):
        row(
            f"engine step gap p50 / p99 ({lat_unit})",
            lambda s: (
                f"{lat(_timing(s, 'step_gap', 'p50'))} / {lat(_timing(s, 'step_gap', 'p99'))}"
            ),
        )
        row(
            "scheduler time p50 (us, host)",
            lambda s: _f(_scaled(_timing(s, "scheduler_time", "p50"), 1e6), "{:.0f}"),
        )
    row("errors", lambda s: str(s["counts"]["failed"]))
    slo = next(iter(summaries.values()), {}).get("goodput") or {}
    if slo.get("slo_s"):
        t.caption = "goodput SLOs: " + ", ".join(f"{k} <= {v:g}s" for k, v in slo["slo_s"].items())
    if any_pool:
        note = (
            "capacity = the most sequences of the workload's mean length (prompt + output) "
            "/ of max_model_len the KV pool holds at once: blocks // ceil(length / block size), "
            "from the pool the engine reports"
        )
        t.caption = f"{t.caption}; {note}" if t.caption else note
    return t


def markdown(table: Table) -> str:
    """The table as Markdown: title, header, rows, caption; names are never cut."""

    def cells(values) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    columns = [list(c.cells) for c in table.columns]
    lines = []
    if table.title:
        lines += [f"**{table.title}**", ""]
    lines.append(cells(c.header for c in table.columns))
    lines.append(cells("---:" if c.justify == "right" else "---" for c in table.columns))
    lines += [cells(row) for row in zip(*columns, strict=True)]
    if table.caption:
        lines += ["", str(table.caption)]
    return "\n".join(lines) + "\n"


def emit_table(
    console: Console, table: Table, folder: Path | None = None, name: str = "comparison.md"
) -> Path | None:
    """Print the table (rich on a terminal, Markdown when piped); write its Markdown into
    `folder` when given. Returns the file written."""
    if console.is_terminal:
        console.print(table)
    else:
        console.print(markdown(table), markup=False, highlight=False, soft_wrap=True)
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(markdown(table), encoding="utf-8")
    return path
