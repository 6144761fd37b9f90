"""What a decode worker's step loop spends importing one request's KV (P/D
disaggregation; docs/disaggregation.md): a fixed part per request plus its bytes over a
copy rate, charged to the worker's next step, so a burst of imports delays the decode
steps of every request on that worker, as it does when served.

Where the served engines spend it:
- the reference engine (`engine/disagg.py`, `execution/model_runner.py`): the engine
  process unpickles the add message (the payload's bytes), then before the step that
  admits the request `import_kv` copies them into a bytearray and `index_copy_`s that into
  the pool: three passes over the bytes on the step loop (the HTTP pull is not: the API
  process pulls while the engine steps);
- vLLM v1 (`v1/worker/kv_connector_model_runner_mixin.py`): the worker calls the
  connector's `start_load_kv` around the forward (before it for synchronous loads, after
  its launch for asynchronous ones); NIXL's pull worker only submits non-blocking reads
  that land in the paged KV and polls them each step (`get_finished`), a connector with a
  host buffer copies host -> device blocks. Either way the loop pays a per-request
  submission and at most one device copy of the bytes.

Rates: `fit.kv_import_bytes_s` when a hardware JSON carries one; a device's (a preset's
HBM: one copy reads and writes each byte, mem_bw x bw_efficiency / 2); a CPU fit's
(`fit.device` cpu: `cbbench calibrate`, or `--from-run` of the reference engine's runs)
the host rate below. A fitted spec that names no device (a from-run fit of a foreign
server) pays the fixed part only: its HBM is unknown, a host rate would overcharge a GPU.
"""

from __future__ import annotations

# a request's bookkeeping on the loop: message decode, block table, index tensor, submit
IMPORT_FIXED_S = 5e-5
# the reference engine's whole import path (unpickle + bytearray + index_copy_) on one
# core, 8.4 MB payloads (64 blocks of the `small` model), measured on the 2-core shared
# development host: 7.1 ms (1.2 GB/s of payload; 1 MB: 1.8 GB/s, 34 MB: 0.8 GB/s)
HOST_IMPORT_BYTES_S = 1.2e9


def import_rate(hw) -> tuple[float | None, str]:
    """(payload bytes/s or None: bytes not priced, where the rate comes from)."""
    fit = getattr(hw, "fit", None) or {}
    if fit.get("kv_import_bytes_s"):
        return float(fit["kv_import_bytes_s"]), "the fit's kv_import_bytes_s"
    if getattr(hw, "steps", False):
        return None, "a steps timeline"
    if fit.get("device") == "cpu":
        return HOST_IMPORT_BYTES_S, "the reference engine's host import path (measured)"
    if hw.linear is None:
        return hw.mem_bw * hw.bw_efficiency / 2, f"{hw.name}'s memory bandwidth, one device copy"
    return None, "the fit names no device; fit.kv_import_bytes_s sets a rate"


def import_time_s(nbytes: int, rate: float | None) -> float:
    return IMPORT_FIXED_S + (nbytes / rate if rate else 0.0)


def describe(hw) -> str:
    """The one line `sim` and `plan` print for a P/D simulation."""
    rate, src = import_rate(hw)
    bw = f"bytes at {rate / 1e9:.3g} GB/s" if rate else "bytes not priced"
    return (f"decode workers' KV import on their step loop: {IMPORT_FIXED_S * 1e3:.2f} ms a "
            f"request + {bw} ({src})")
