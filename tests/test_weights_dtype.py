"""`cbbench serve --dtype bfloat16` on the CPU path, over real HTTP on 127.0.0.1 with the
official openai client: it answers, and its first token's logprob is close to (but not the
same as) the fp32 server's on the same prompt and weights (the weights really are bf16)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
from cbbench.harness.servers.launcher import launch_reference_server

PROMPT = "Continuous batching schedules every iteration"


def first_token(dtype: str) -> tuple[str, float, int]:
    with launch_reference_server(model="tiny", extra_args=["--dtype", dtype]) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=4, temperature=0.0, logprobs=1
        )
    lp = r.choices[0].logprobs
    return lp.tokens[0], lp.token_logprobs[0], r.usage.completion_tokens


def test_bf16_weights_serve_close_to_fp32() -> None:
    # the two servers start, answer and stop side by side (each in its own process)
    with ThreadPoolExecutor(2) as pool:
        fp32, bf16 = pool.map(first_token, ["float32", "bfloat16"])
    (_, lp32, n32), (_, lp16, n16) = fp32, bf16
    assert n32 == n16 == 4
    assert lp16 != lp32  # bf16 weights change the numbers at all
    assert abs(lp16 - lp32) < 0.05  # tiny's logits are flat: logprobs near -log(512) = -6.2
    assert lp32 < 0
