"""`cbbench serve --model tiny-moe` over real HTTP on 127.0.0.1: the official openai client
gets completions, and /metrics (prometheus-client's text, read back with its parser) counts
every routed (token, expert) pair per layer and shows the load imbalance."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from cbbench.harness.servers.launcher import launch_reference_server
from cbbench.reference_engine.model.config import preset_config
from cbbench.reference_engine.server.metrics import ExpertLoadMetrics, imbalance
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

CFG = preset_config("tiny-moe")


def expert_samples(base_url: str) -> dict[str, dict[tuple[str, ...], float]]:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("cbbench:expert"):
                key = (s.labels["layer"], s.labels.get("expert", ""))
                out.setdefault(s.name, {})[key] = s.value
    return out


def per_layer_tokens(samples) -> dict[str, float]:
    totals: dict[str, float] = {}
    for (layer, _), v in samples.get("cbbench:expert_tokens_total", {}).items():
        totals[layer] = totals.get(layer, 0.0) + v
    return totals


def test_serve_tiny_moe_answers_openai_and_exports_expert_load():
    with launch_reference_server(model="tiny-moe", scheduler="continuous") as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        forwarded = 0  # tokens through the model: the prompt, then each output but the last
        for prompt in ["The quick brown fox", "Mixture of experts routes every token", "hi"]:
            r = client.completions.create(
                model="tiny-moe", prompt=prompt, max_tokens=6, temperature=0.0
            )
            assert r.choices[0].text and r.usage.completion_tokens == 6
            forwarded += r.usage.prompt_tokens + r.usage.completion_tokens - 1
        want = float(CFG.num_experts_per_tok * forwarded)
        deadline = time.monotonic() + 10
        while True:  # the stats of the last step reach the API process just after its answer
            samples = expert_samples(server.base_url)
            if set(per_layer_tokens(samples).values()) == {want} or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    tokens = samples["cbbench:expert_tokens_total"]
    assert len(tokens) == CFG.num_hidden_layers * CFG.num_experts  # every series, zeros too
    assert per_layer_tokens(samples) == {"0": want, "1": want}
    for name in ("cbbench:expert_load_imbalance", "cbbench:expert_load_imbalance_cumulative"):
        gauges = samples[name]
        assert set(gauges) == {("0", ""), ("1", "")}
        assert all(1.0 <= v <= CFG.num_experts / CFG.num_experts_per_tok for v in gauges.values())
    for layer in ("0", "1"):
        row = [tokens[(layer, str(e))] for e in range(CFG.num_experts)]
        cumulative = samples["cbbench:expert_load_imbalance_cumulative"][(layer, "")]
        assert cumulative == pytest.approx(imbalance(row))


def test_imbalance_gauges_follow_the_engine_counts():
    m = ExpertLoadMetrics(CollectorRegistry(), "m")
    m.update([[0, 0, 0, 0], [], [0, 0, 0, 0]])  # a dense layer in the middle
    m.update([[4, 4, 4, 4], [], [16, 0, 0, 0]])
    assert m.imbalance.labels("m", "0")._value.get() == 1.0
    assert m.imbalance.labels("m", "2")._value.get() == 4.0
    m.update([[4, 4, 4, 12], [], [16, 0, 0, 16]])  # last step: layer 0 all on expert 3
    assert m.imbalance.labels("m", "0")._value.get() == 4.0
    assert m.imbalance_cumulative.labels("m", "0")._value.get() == pytest.approx(12 * 4 / 24)
    assert m.imbalance.labels("m", "2")._value.get() == 4.0  # this step: all on expert 3
    assert m.imbalance_cumulative.labels("m", "2")._value.get() == 2.0
    assert m.tokens.labels("m", "2", "3")._value.get() == 16
    assert imbalance([0, 0]) == 1.0
