"""A server's own per-request times, read from the response's last chunk or body.

Three shapes, one result (seconds, the server's clock, each None when the server did not
say):
- vLLM (`--enable-per-request-metrics`): a `metrics` object on the final usage chunk (or the
  body): queue_time_ms (queued -> scheduled), time_to_first_token_ms (scheduled -> first
  token: the server's prefill, queue excluded), generation_time_ms (first -> last token),
  mean_itl_ms;
- llama.cpp: `timings` (prompt_ms, predicted_ms; no queue time);
- the reference engine: its `cbbench` field (queue_time_s, prefill_time_s, decode_time_s).

`_apply` in response.py stores the raw object in the response state (only on chunks it
already parses in full: usage, finish, cbbench); `server_times(state)` turns it into
{"source", "queue_s", "prefill_s", "decode_s"} once, when the request finishes.
"""

from __future__ import annotations

KEYS = ("queue_s", "prefill_s", "decode_s")
_NUMBER = (int, float)  # as `int | float`, without building the union on every call


def _ms(obj: dict, key: str) -> float | None:
    v = obj.get(key)
    return v / 1e3 if isinstance(v, _NUMBER) and not isinstance(v, bool) and v >= 0 else None


def _s(obj: dict, key: str) -> float | None:
    v = obj.get(key)
    return float(v) if isinstance(v, _NUMBER) and not isinstance(v, bool) and v >= 0 else None


def server_times(state: dict) -> dict | None:
    """The server's per-request times from a finished response's state, or None."""
    m = state.get("metrics")
    if type(m) is dict:
        return {
            "source": "vllm",
            "queue_s": _ms(m, "queue_time_ms"),
            "prefill_s": _ms(m, "time_to_first_token_ms"),
            "decode_s": _ms(m, "generation_time_ms"),
        }
    t = state.get("timings")
    if type(t) is dict:
        return {
            "source": "llama.cpp",
            "queue_s": None,
            "prefill_s": _ms(t, "prompt_ms"),
            "decode_s": _ms(t, "predicted_ms"),
        }
    c = state.get("cbbench")
    if type(c) is dict and ("prefill_time_s" in c or "queue_time_s" in c):
        return {
            "source": "cbbench",
            "queue_s": _s(c, "queue_time_s"),
            "prefill_s": _s(c, "prefill_time_s"),
            "decode_s": _s(c, "decode_time_s"),
        }
    return None
