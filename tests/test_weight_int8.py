"""`--quantization int8`: int8 weight-only linears on the CPU (kernels/cpu_linear_bf16.py
`pack_int8` / `linear_int8`, reference_engine/execution/cpu_linear.py `Int8Linear`). The kernel
against an fp64 matmul over the dequantized weight, the quantizer's error bound, the engine
and server with every linear quantized, its accuracy cost through `cbbench quality`, and the
bad combinations as one-line errors."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from cbbench.harness.cli import main
from cbbench.kernels import cpu_linear_bf16
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cpu_linear import Int8Linear
from cbbench.reference_engine.execution.model_runner import ModelRunner
from engine_model_support import paged_logits
from server_support import serve

needs_kernel = pytest.mark.skipif(
    cpu_linear_bf16.load() is None, reason=f"int8 kernel: {cpu_linear_bf16.unavailable_reason()}"
)
PROMPT = [5, 17, 300, 42, 7, 99, 12, 250, 3]


def test_pack_int8_bounds_each_rows_error_by_half_its_step():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(19, 40, generator=gen)
    w[3] = 0.0  # an all-zero row: scale 1, codes 0
    w[5, 7] = 1e6  # one huge element: its row's step is huge, the others' are not
    panels, scales = cpu_linear_bf16.pack_int8(w)
    assert panels.shape == (3, 40, 8) and panels.dtype == torch.int8
    assert scales.shape == (19,) and scales.dtype == torch.float32
    assert scales[3] == 1.0 and int(panels.abs().max()) <= 127
    deq = cpu_linear_bf16.unpack_int8(panels, scales)
    assert deq.shape == w.shape and bool((deq[3] == 0).all())
    assert bool(((deq - w).abs() <= scales[:, None] / 2 * (1 + 1e-6)).all())
    assert float(scales[0]) == pytest.approx(float(w[0].abs().max()) / 127)
    assert float(deq[5, 7]) == pytest.approx(1e6)  # the row's largest is code 127 exactly


@needs_kernel
@pytest.mark.parametrize("k_in", [16, 513])
@pytest.mark.parametrize("n_out", [1, 31, 96])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_equals_an_fp64_matmul_on_the_dequantized_weight(k_in, n_out, with_bias):
    gen = torch.Generator().manual_seed(n_out * 1000 + k_in)
    w = torch.randn(n_out, k_in, generator=gen)
    b = torch.randn(n_out, generator=gen) if with_bias else None
    panels, scales = cpu_linear_bf16.pack_int8(w)
    deq = cpu_linear_bf16.unpack_int8(panels, scales).double()
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in (1, 3, 4, 5, 8, 33):
                x = torch.randn(rows, k_in, generator=gen)
                want = x.double() @ deq.T + (0 if b is None else b.double())
                got = cpu_linear_bf16.linear_int8(x, panels, scales, b)
                assert got.shape == (rows, n_out) and got.dtype == torch.float32
                err = float((got.double() - want).abs().max()) / float(want.abs().max())
                assert err < 1e-5, (threads, rows, k_in, n_out, err)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_int8_linear_module_keeps_the_input_dtype_and_bad_shapes_fail():
    lin = torch.nn.Linear(24, 10)
    m = Int8Linear(lin)
    x = torch.randn(2, 3, 24)
    assert m(x).shape == (2, 3, 10) and m(x).dtype == torch.float32
    assert m(x.bfloat16()).dtype == torch.bfloat16
    torch.testing.assert_close(m(x), lin(x), rtol=0.05, atol=0.05)  # int8 steps, not exact
    with pytest.raises(RuntimeError, match="linear_int8: x has K=25"):
        m(torch.randn(2, 25))


@needs_kernel
def test_runner_quantizes_every_linear_at_a_quarter_of_the_bytes():
    fp32 = ModelRunner("tiny", num_kv_blocks=8, block_size=16)
    q = ModelRunner("tiny", num_kv_blocks=8, block_size=16, quantization="int8")
    assert q.linear_impl == f"int8-{cpu_linear_bf16.isa()}"
    mods = list(q.model.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in mods)
    int8 = [m for m in mods if isinstance(m, Int8Linear)]
    assert int8 and all(m.panels.dtype == torch.int8 for m in int8)
    weights = sum(m.in_features * m.out_features for m in int8)
    stored = sum(m.panels.numel() + 4 * m.scales.numel() for m in int8)
    # a byte per weight plus 4 per output row (tiny's rows are 64 wide: +6 %); fp32 has 4
    assert all(m.panels.numel() == -(-m.out_features // 8) * 8 * m.in_features for m in int8)
    assert stored <= 0.3 * 4 * weights
    want, got = paged_logits(fp32.model, PROMPT), paged_logits(q.model, PROMPT)
    assert not torch.equal(got, want)  # the weights really changed
    # tiny's logits are near-flat (|logit| ~0.2): int8 moves them by a few 1e-3
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2)
    assert q.model.model.embed_tokens.weight.dtype == torch.float32  # the table stays fp32


def test_bad_combinations_are_one_line_errors(capsys):
    with pytest.raises(EngineError, match="quantization must be one of int8 or None, got 'int4'"):
        EngineConfig(quantization="int4")
    with pytest.raises(EngineError, match="simulated executor has no cost model"):
        EngineConfig(quantization="int8", executor="sim")
    with pytest.raises(EngineError, match="--quantization int8: CPU only .*not device 'cuda'"):
        EngineConfig(quantization="int8", device="cuda")  # before any CUDA is touched
    with pytest.raises(EngineError, match="--quantization int8: CPU only, not device 'cuda'"):
        ModelRunner("tiny", num_kv_blocks=8, block_size=16, device="cuda", quantization="int8")
    assert main(["sim", "--model", "tiny", "--quantization", "int8", "--num-requests", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "simulated executor" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--quantization", "int4"])
    assert exc.value.code == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err


@needs_kernel
def test_served_with_int8_weights_over_http(tmp_path):
    cfg = EngineConfig(model="tiny", quantization="int8", num_kv_blocks=32)
    with serve(cfg) as (url, stack):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
        )
        models = client.models.list().model_dump()
    assert r.usage.completion_tokens == 6
    info = json.dumps(models)
    assert '"quantization": "int8"' in info and '"linear_impl": "int8-' in info


@needs_kernel
def test_quality_reports_the_int8_weights_cost(tmp_path):
    out = tmp_path / "q.json"
    assert main(["quality", "--quantization", "int8", "--out", str(out), "--json"]) == 0
    (row,) = json.loads(out.read_text())
    assert row["quantization"] == "int8" and row["dtype"] == "float32"
    assert row["kv_cache_dtype"] == "auto"
    # measured on tiny at the defaults: agreement 0.985, KL mean 4.6e-4, max 2.4e-3
    assert row["greedy_agreement"] >= 0.95
    assert 0 < row["kl_mean"] < 5e-3 and row["kl_max"] < 2.5e-2
