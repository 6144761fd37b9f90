"""What bench_gpu reports: peak bandwidth by device name, bytes per decode call, and the
JSON + text summary it writes. Needs no GPU (tested on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

# Peak HBM bandwidth (bytes/s) by device-name substring, most specific first.
PEAK_BANDWIDTH = [
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),  # SXM / HBM3
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB", 1.935e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
    ("RTX 4090", 1.008e12),
]


def peak_bandwidth(device_name: str) -> float | None:
    for key, bw in PEAK_BANDWIDTH:
        if key.lower() in device_name.lower():
            return bw
    return None


def decode_bytes(
    batch: int, context: int, num_q_heads: int, num_kv_heads: int, head_dim: int, elem: int
) -> int:
    """Bytes one decode call must move: K and V of every cached token, q in, out."""
    return (2 * batch * context * num_kv_heads + 2 * batch * num_q_heads) * head_dim * elem


def write_results(out_dir: Path, report: dict) -> str:
    """bench_gpu.json plus a short text summary; returns the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"device: {report.get('device')}  peak {report.get('peak_gbps', 0):.0f} GB/s "
        f"({report.get('peak_source')}), device-to-device copy "
        f"{report.get('measured_copy_gbps', 0):.0f} GB/s"
    ]
    checks = report.get("correctness", [])
    bad = [c for c in checks if not c["passed"]]
    lines.append(f"correctness: {len(checks) - len(bad)}/{len(checks)} passed")
    lines += [
        f"  FAIL {c['name']} {c['dtype']}: {c['max_abs_err']:.3g} > {c['tol']:.3g}" for c in bad
    ]
    if report.get("decode"):
        shape = report.get("decode_shape", {})
        lines.append(
            f"decode bf16 (heads {shape.get('num_q_heads')} q / {shape.get('num_kv_heads')} kv x "
            f"{shape.get('head_dim')}, block {shape.get('block_size')}): "
            "batch context  triton GB/s (of peak)  sdpa-dense GB/s (of peak)"
        )
        for r in report["decode"]:
            lines.append(
                f"  {r['batch']:>5} {r['context']:>7}  {r['triton_gbps']:8.0f} ({r['triton_frac_peak']:.0%})"
                f"  {r['sdpa_dense_gbps']:8.0f} ({r['sdpa_dense_frac_peak']:.0%})"
                + ("" if r.get("values_ok", True) else "  VALUES DIFFER from dense SDPA")
            )
    goal = report.get("goal")
    if goal:
        lines.append(
            f"goal: decode batch {goal['batch']} context {goal['context']} bf16 >= "
            f"{goal['fraction']:.0%} of peak: measured {goal.get('measured', 'n/a')} -> "
            f"{'MET' if goal.get('met') else 'NOT MET'}"
        )
    for r in report.get("prefill", []):
        base = f", sdpa-dense {r['sdpa_dense_tflops']:.0f}" if "sdpa_dense_tflops" in r else ""
        lines.append(
            f"prefill {r['num_seqs']}x{r['new_tokens']} on {r['cached_tokens']} cached: "
            f"triton {r['triton_tflops']:.0f} TFLOP/s{base}"
        )
    if report.get("decode_tile_sweep"):
        best = max(report["decode_tile_sweep"], key=lambda r: r["frac_peak"])
        lines.append(
            f"decode tile sweep at the goal point: best block_n {best['block_n']}, "
            f"num_warps {best['num_warps']}: {best['frac_peak']:.0%} of peak"
        )
    e = report.get("engine")
    if e:
        c = e["checked"]
        lines.append(
            f"engine ({e['model']}, {e['device']}): backend {c['backend']}, "
            f"{c['attention_calls']} attention calls, {c['output_tok_per_s']:.0f} tok/s "
            f"(torch backend {e['torch']['output_tok_per_s']:.0f}); identical greedy streams "
            f"{e['identical_streams']} -> {'PASS' if e['passed'] else 'FAIL'}"
        )
    text = "\n".join(lines) + "\n"
    (out_dir / "summary.txt").write_text(text)
    return text
