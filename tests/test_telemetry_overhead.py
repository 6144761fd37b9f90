"""The sampling-cost measurement runs end to end (a tiny setting; the real figures come from
`python -m tests.benchmarks.studies.telemetry_overhead`)."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.studies.telemetry_overhead import main, vllm_like_exposition


def test_exposition_is_vllm_sized_and_detected_as_vllm() -> None:
    from cbbench.harness.telemetry.adapters import VLLM, detect
    from cbbench.harness.telemetry.prom import parse_metrics

    text = vllm_like_exposition().decode()
    scrape = parse_metrics(text)
    assert detect(scrape) is VLLM and len(text) > 15_000
    assert VLLM.read(scrape)["kv_usage"] == 0.62
    assert scrape.histogram("vllm:request_queue_time_seconds").count == 200


@pytest.mark.slow
def test_overhead_command_prints_the_ratios(capsys) -> None:
    assert main(["--pairs", "1", "--requests", "200", "--streams", "16", "--tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"client CPU per request on/off: median \d+\.\d{4}", out)
    assert re.search(r"that is \d+\.\d\d% of one core", out)
    assert re.search(r"sampler threads' own CPU during the 'on' runs: median \d+\.\d\d%", out)
