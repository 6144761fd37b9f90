"""`cbbench serve --served-model-name` says which checkpoint it serves in its model card's
`root`, as vLLM does, so report and gate hold it against vLLM serving the same checkpoint: a
report of vLLM (root /ckpt) beside `cbbench serve --model /ckpt --served-model-name
tiny-llama` said "Not comparable: model differs (vllm: /ckpt, cbb: tiny-llama)"."""

from __future__ import annotations

import httpx
from cbbench.harness.results.comparability import differences
from cbbench.harness.servers.launcher import launch_reference_server


def test_served_model_name_keeps_the_checkpoint_as_root():
    extra = ["--served-model-name", "tiny-llama"]
    with launch_reference_server(model="tiny", scheduler="continuous", extra_args=extra) as srv:
        card = httpx.get(f"{srv.base_url}/v1/models", timeout=30).json()["data"][0]
    assert card["id"] == "tiny-llama" and card["root"] == "tiny"
    cb = {"target": {"model": "tiny-llama", "engine": {"owned_by": "cbbench", "root": "tiny"}}}
    vllm = {"target": {"model": "tiny-llama", "engine": {"owned_by": "vllm", "root": "tiny"}}}
    assert "model" not in {d.aspect for d in differences(vllm, cb)}
