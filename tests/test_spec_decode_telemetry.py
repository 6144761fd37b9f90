"""Speculative decoding telemetry: the adapters read vLLM's spec_decode counters (over the
run's window) and SGLang's acceptance gauges, from a real loopback /metrics server; a
server without speculation gets no spec fields (absent, never zero)."""

from __future__ import annotations

import pytest
from telemetry_server import MetricsServer, fixture, set_value
from test_telemetry_adapters import run_sampler

VLLM_SPEC = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 300.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 90.0
"""

SGLANG_SPEC = """\
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m",tp_rank="0"} 3.0
# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="m",tp_rank="0"} 0.5
"""


def test_vllm_spec_counters_over_the_window():
    def change(text: str) -> str:  # during the run: 50 drafts, 200 drafted, 120 accepted
        text = set_value(text, "vllm:spec_decode_num_drafts_total", 150.0)
        text = set_value(text, "vllm:spec_decode_num_draft_tokens_total", 600.0)
        return set_value(text, "vllm:spec_decode_num_accepted_tokens_total", 420.0)

    with MetricsServer(fixture("vllm.txt") + VLLM_SPEC) as server:
        _, summary = run_sampler(server, change=change)
    assert summary["engine"] == "vllm"
    assert summary["spec_acceptance_rate"] == pytest.approx(120 / 200)
    assert summary["spec_mean_accepted_length"] == pytest.approx(1 + 120 / 50)


def test_vllm_spec_counters_idle_window_leaves_fields_out():
    with MetricsServer(fixture("vllm.txt") + VLLM_SPEC) as server:
        _, summary = run_sampler(server)
    assert "spec_acceptance_rate" not in summary  # nothing drafted in the window


def test_sglang_spec_gauges_run_mean():
    def change(text: str) -> str:
        text = set_value(text, "sglang:spec_accept_rate", 0.7)
        return set_value(text, "sglang:spec_accept_length", 4.0)

    with MetricsServer(fixture("sglang.txt") + SGLANG_SPEC) as server:
        samples, summary = run_sampler(server, change=change)
    assert summary["engine"] == "sglang"
    assert 0.5 < summary["spec_acceptance_rate"] < 0.7
    assert 3.0 < summary["spec_mean_accepted_length"] < 4.0


@pytest.mark.parametrize("name", ["vllm.txt", "sglang.txt", "tgi.txt"])
def test_no_speculation_no_spec_fields(name):
    with MetricsServer(fixture(name)) as server:
        _, summary = run_sampler(server)
    assert not any(k.startswith("spec_") for k in summary)
    assert not any(k.startswith("spec_") for k in summary["unavailable"])
