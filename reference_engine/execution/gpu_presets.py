"""GPU and interconnect presets for the simulator's roofline (cost_model.HardwareSpec fields).

Peaks from the vendors' spec sheets: dense BF16 tensor FLOP/s (no sparsity), memory bandwidth,
memory; the link is what a tensor-parallel all-reduce crosses between the GPUs of one replica
(NVLink where the card has it, else PCIe), one direction's bandwidth per GPU and a latency per
all-reduce. `error` is what the preset was measured with against real runs (relative error of
the simulated TTFT / TPOT / E2E means, docs/fitting-any-server.md#gpu-presets-and-their-error), or None:
nothing measured it, and `sim` / `plan` say "error unknown".

The memory-bound decode step (bandwidth efficiency 0.82, a fixed 0.6 ms a step) is fitted on
two published single-request vLLM decode measurements of Llama-3.1-8B in BF16: 75 tok/s on an
A100 40GB (vLLM 0.23, 1,024 in / 128 out) and a 6.48 ms TPOT p50 on an H100 80GB HBM3 (vLLM
0.21); two points, two terms, so it is not a measured error: docs/planning.md cites them and
the out-of-sample checks. FLOP/s efficiency stays cost_model's 0.6 (no public prefill-only
measurement clean enough to fit it).
"""

from __future__ import annotations

# the decode roofline fitted on the two published points above (every GPU preset)
FITTED = dict(bw_efficiency=0.82, step_overhead_s=6e-4)
EFFICIENCY_SOURCE = ("bw_efficiency and step_overhead_s fitted on published vLLM decode "
                     "measurements (Llama-3.1-8B BF16, one request: A100 40GB 75 tok/s, H100 "
                     "6.48 ms TPOT); docs/fitting-any-server.md#gpu-presets-and-their-error")  # fmt: skip

# name -> (bytes/s one direction per GPU, seconds per all-reduce)
LINKS: dict[str, tuple[float, float]] = {
    "nvlink3": (300e9, 8e-6),  # A100: 600 GB/s both directions
    "nvlink4": (450e9, 8e-6),  # H100 / H200 SXM: 900 GB/s
    "nvlink5": (900e9, 6e-6),  # B200: 1.8 TB/s
    "pcie4": (25e9, 20e-6),  # x16, ~32 GB/s raw
    "pcie5": (50e9, 20e-6),  # x16, ~64 GB/s raw
}

# name -> HardwareSpec keyword arguments (peak_flops, mem_bw, mem_gb, link, ...)
GPU_PRESETS: dict[str, dict] = {
    "a100-40g": dict(peak_flops=312e12, mem_bw=1.555e12, mem_gb=40, link="nvlink3"),
    "a100-80g": dict(peak_flops=312e12, mem_bw=2.039e12, mem_gb=80, link="nvlink3"),
    "h100-sxm": dict(peak_flops=989e12, mem_bw=3.35e12, mem_gb=80, link="nvlink4"),
    "h100-pcie": dict(peak_flops=756e12, mem_bw=2.0e12, mem_gb=80, link="pcie5"),
    "h200": dict(peak_flops=989e12, mem_bw=4.8e12, mem_gb=141, link="nvlink4"),
    "b200": dict(peak_flops=2250e12, mem_bw=8.0e12, mem_gb=180, link="nvlink5"),
    "l4": dict(peak_flops=121e12, mem_bw=0.3e12, mem_gb=24, link="pcie4"),
    "l40s": dict(peak_flops=362e12, mem_bw=0.864e12, mem_gb=48, link="pcie4"),
    "rtx-4090": dict(peak_flops=165e12, mem_bw=1.008e12, mem_gb=24, link="pcie4"),
    "rtx-5090": dict(peak_flops=209e12, mem_bw=1.792e12, mem_gb=32, link="pcie5"),
    "rtx-6000-ada": dict(peak_flops=182e12, mem_bw=0.96e12, mem_gb=48, link="pcie4"),
    "rtx-pro-6000": dict(peak_flops=500e12, mem_bw=1.792e12, mem_gb=96, link="pcie5"),
}

GPU_ALIASES = {"h100": "h100-sxm", "a100": "a100-80g", "4090": "rtx-4090",
               "rtx-pro-6000-blackwell": "rtx-pro-6000", "5090": "rtx-5090"}  # fmt: skip
