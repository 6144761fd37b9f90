"""Quantized KV cache kernels (kernels/kv_quant.py) against the plain oracle (reference.py).

Stated tolerances:
- the write: the torch backend's packed rows equal the oracle's row-by-row quantization
  bit for bit (int8 and fp8);
- the scale is the row's E8M0 byte: the smallest power of two with absmax / scale <= QMAX
  (127 int8, 448 e4m3); a zero row gets e = 1 (2**-126, zero codes), tiny rows clamp to it,
  an inf row gets e = 254 and saturated codes;
- a dequantized int8 element is within half its row's step (scale / 2) of the input, and
  scale < 2 * absmax / 127, so within absmax / 127; fp8 e4m3 within 2**-4 of the row's
  absmax (3 mantissa bits);
- attention over a quantized (or bf16) cache equals the oracle's attention over the
  dequantized cache to 1e-5 (fp32 compute; only summation order differs);
- against attention over the original fp32 values: int8 within 6e-2, fp8 within 1.6e-1,
  bf16 within 2e-2 absolute (unit-variance K, V and q, scale 0.25). Measured max over 20
  seeds of these cases: int8 0.045 (0.015 with the earlier fp16 scale), fp8 0.121 (0.098):
  an E8M0 step is up to 2x an fp16 scale's; the bounds are ~1.3x the measured worst.
"""

from __future__ import annotations

import pytest
import torch
import triton_interpret  # noqa: F401  (before anything imports triton uninterpreted)
from cbbench.kernels import get_attention_backend, kv_quant
from cbbench.kernels.reference import (
    make_paged_case,
    ref_dequantize_cache,
    ref_paged_attention,
    ref_quantize_cache,
    ref_quantize_row,
)

QUANT = [torch.int8, torch.float8_e4m3fn]
VS_FP32 = {torch.int8: 6e-2, torch.float8_e4m3fn: 1.6e-1, torch.bfloat16: 2e-2}
SCALE = 0.25


def _backend():
    return get_attention_backend("torch", "cpu")


@pytest.mark.parametrize("dtype", QUANT)
def test_write_quantizes_each_row_as_the_oracle(dtype):
    gen = torch.Generator().manual_seed(1)
    t, h, d, nb, bs = 7, 2, 16, 4, 4
    key = torch.randn(t, h, d, generator=gen) * torch.linspace(0.01, 30, t)[:, None, None]
    value = torch.randn(t, h, d, generator=gen)
    key[3] = 0.0  # an all-zero row: the tiny scale, zero codes
    slots = torch.tensor([0, 5, 6, 9, -1, 15, 2])
    k_cache = torch.zeros(nb, bs, h, d + 1, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    _backend().reshape_and_cache(key, value, k_cache, v_cache, slots)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        for head in range(h):
            got = k_cache[slot // bs, slot % bs, head]
            assert torch.equal(
                got.view(torch.uint8), ref_quantize_row(key[i, head], dtype).view(torch.uint8)
            )
            got = v_cache[slot // bs, slot % bs, head]
            assert torch.equal(
                got.view(torch.uint8), ref_quantize_row(value[i, head], dtype).view(torch.uint8)
            )
    assert not bool(kv_quant.dequantize(k_cache[0, 3]).any()), "slot 3 was never written"
    assert not bool(kv_quant.dequantize(k_cache[2, 1]).any()), "the zero row dequantizes to 0"


@pytest.mark.parametrize("dtype", QUANT)
def test_dequantized_error_is_within_the_rows_step(dtype):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(64, 4, 32, generator=gen) * torch.logspace(-3, 3, 64)[:, None, None]
    packed = kv_quant.quantize(x, dtype)
    assert packed.shape == (64, 4, 33)
    back = kv_quant.dequantize(packed)
    amax = x.abs().amax(-1, keepdim=True)
    scale = kv_quant.exponent_scale(packed[..., 32:].view(torch.uint8))
    top = kv_quant.qmax(dtype)
    # the scale is the smallest power of two that fits the row: absmax / scale in (QMAX/2, QMAX]
    assert bool((amax / scale <= top).all()) and bool((amax / scale > top / 2).all())
    assert bool((torch.frexp(scale).mantissa == 0.5).all()), "a power of two"
    if dtype == torch.int8:  # half a step, and a step is < 2 * absmax / 127: <= absmax / 127
        assert bool(((back - x).abs() <= scale / 2).all())
        bound = amax / 127
    else:  # 3 mantissa bits
        bound = amax * 2.0**-4
    assert bool(((back - x).abs() <= bound).all())


@pytest.mark.parametrize("dtype", QUANT)
def test_scale_byte_edges_zero_underflow_overflow_and_exact_fits(dtype):
    top = kv_quant.qmax(dtype)
    rows = torch.zeros(6, 8)
    rows[1, 0] = 1e-40  # fp32 subnormal: far below 2**-126 * QMAX
    rows[2, :2] = torch.tensor([1e-38, -3e-39])  # below QMAX * 2**-126: clamps to e = 1
    rows[3, :3] = torch.tensor([top * 2.0**5, -64.0, 48.0])  # exactly QMAX * 32: scale 32
    rows[4, 0] = torch.nextafter(torch.tensor(top * 2.0**5), torch.tensor(1e9))  # just over
    rows[5, :3] = torch.tensor([float("inf"), -float("inf"), 1.0])
    packed = kv_quant.quantize(rows, dtype)
    e = packed[:, 8].view(torch.uint8).tolist()
    assert e == [1, 1, 1, 127 + 5, 127 + 6, 254]
    back = kv_quant.dequantize(packed)
    assert bool(torch.isfinite(back[:5]).all()), "no NaN or inf from a zero or tiny row"
    assert not bool(back[0].any()), "the zero row: zero codes, so exactly 0"
    assert bool(((back[1:3] - rows[1:3]).abs() <= 2.0**-127).all()), "underflow: to 0 or 1 step"
    tie = 64.0 if dtype == torch.int8 else 48.0  # 48 / 32 = 1.5: int8 rounds half to even
    assert back[3, :3].tolist() == [top * 2.0**5, -64.0, tie]
    assert float(packed[5, 0].float()) == top and float(packed[5, 1].float()) == -top  # saturate
    for r in range(6):  # the oracle agrees on every edge, bit for bit
        assert torch.equal(
            packed[r].view(torch.uint8), ref_quantize_row(rows[r], dtype).view(torch.uint8)
        ), r


def _quantized_case(dtype, seq_lens, query_lens, group=2):
    case = make_paged_case(seq_lens, query_lens, block_size=4, num_kv_heads=2, group=group)
    full = {k: case[k] for k in ("k_cache", "v_cache")}
    if dtype == torch.bfloat16:
        case["k_cache"], case["v_cache"] = full["k_cache"].bfloat16(), full["v_cache"].bfloat16()
        deq = {k: case[k].float() for k in full}
    else:
        case["k_cache"] = ref_quantize_cache(full["k_cache"], dtype)
        case["v_cache"] = ref_quantize_cache(full["v_cache"], dtype)
        deq = {k: ref_dequantize_cache(case[k]) for k in full}
    return case, deq, full


def _ref(case, caches):
    return ref_paged_attention(
        case["q"], caches["k_cache"], caches["v_cache"], case["block_tables"],
        case["seq_lens"], case["query_start_loc"], SCALE,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [*QUANT, torch.bfloat16])
def test_decode_matches_the_dequantized_reference(dtype):
    seq_lens = [1, 5, 9, 16, 23]
    case, deq, full = _quantized_case(dtype, seq_lens, [1] * len(seq_lens))
    out = _backend().paged_decode_attention(
        case["q"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"], SCALE
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _ref(case, deq), atol=1e-5, rtol=1e-5)
    assert float((out - _ref(case, full)).abs().max()) < VS_FP32[dtype]


@pytest.mark.parametrize("dtype", [*QUANT, torch.bfloat16])
def test_varlen_prefill_and_decode_match_the_dequantized_reference(dtype):
    seq_lens, query_lens = [6, 13, 3, 20], [6, 1, 2, 1]  # prefill, decode, chunk, decode
    case, deq, full = _quantized_case(dtype, seq_lens, query_lens, group=1)
    out = _backend().paged_attention(
        case["q"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"],
        case["query_start_loc"], SCALE,
    )  # fmt: skip
    torch.testing.assert_close(out, _ref(case, deq), atol=1e-5, rtol=1e-5)
    assert float((out - _ref(case, full)).abs().max()) < VS_FP32[dtype]


def test_cache_geometry_and_dtype_names():
    assert kv_quant.row_width(64, torch.int8) == 65
    assert kv_quant.row_bytes(64, torch.float32) == 256
    assert kv_quant.row_bytes(64, torch.int8) == 65
    assert kv_quant.cache_torch_dtype("auto", torch.float32) is torch.float32
    assert kv_quant.cache_torch_dtype("bf16", torch.float32) is torch.bfloat16
    assert kv_quant.cache_torch_dtype("fp8", torch.float32) is torch.float8_e4m3fn
    with pytest.raises(ValueError, match="unknown kv cache dtype 'int4'"):
        kv_quant.cache_torch_dtype("int4", torch.float32)


def test_fp8_without_the_torch_type_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(kv_quant, "fp8_dtype", lambda: None)
    with pytest.raises(ValueError, match=r"fp8 needs torch.float8_e4m3fn.*use int8") as exc:
        kv_quant.cache_torch_dtype("fp8", torch.float32)
    assert "\n" not in str(exc.value)


@pytest.fixture
def triton_backend(monkeypatch):
    """The Triton backend under the interpreter (CPU tensors), tiny sizes."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return get_attention_backend("triton", "cpu")


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter: inf - inf
def test_triton_writes_the_same_int8_bytes_as_the_torch_backend(triton_backend):
    gen = torch.Generator().manual_seed(3)
    t, h, d = 6, 2, 16
    key = torch.randn(t, h, d, generator=gen) * torch.linspace(0.01, 30, t)[:, None, None]
    key[2] = 0.0
    key[4, 0, :3] = torch.tensor([127.0, 0.5, -1.5])  # absmax 127: scale 1, .5 ties to even
    value = torch.randn(t, h, d, generator=gen) * torch.logspace(-38, 38, t)[:, None, None]
    value[1, 1] = 0.0
    value[1, 1, 0] = 1e-40  # a lone subnormal: the E8M0 byte clamps to 1
    value[5, 0, 2] = float("inf")  # saturates at e = 254
    slots = torch.tensor([0, 5, 6, -1, 9, 15])
    caches = []
    for backend in (triton_backend, _backend()):
        k_cache = torch.zeros(4, 4, h, d + 1, dtype=torch.int8)
        v_cache = torch.zeros_like(k_cache)
        backend.reshape_and_cache(key, value, k_cache, v_cache, slots)
        caches.append((k_cache, v_cache))
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    e = caches[0][1][..., d].view(torch.uint8)
    assert int(e[1, 1, 1]) == 1 and int(e[3, 3, 0]) == 254  # slots 5 and 15: the edges
    assert int(e[0, 0].min()) == 1 and 127 + 60 < int(e[2, 1].max()) < 254  # 1e-38, 1e23


def test_triton_int8_decode_and_prefill_match_the_dequantized_reference(triton_backend):
    case, deq, full = _quantized_case(torch.int8, [5, 9, 17], [1, 1, 1])
    out = triton_backend.paged_decode_attention(
        case["q"], case["k_cache"], case["v_cache"], case["block_tables"],
        case["seq_lens"], SCALE,
    )  # fmt: skip
    torch.testing.assert_close(out, _ref(case, deq), atol=1e-5, rtol=1e-5)
    case, deq, full = _quantized_case(torch.int8, [6, 11], [6, 3], group=1)
    out = triton_backend.paged_attention(
        case["q"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"],
        case["query_start_loc"], SCALE,
    )  # fmt: skip
    torch.testing.assert_close(out, _ref(case, deq), atol=1e-5, rtol=1e-5)
    assert float((out - _ref(case, full)).abs().max()) < VS_FP32[torch.int8]


def test_triton_refuses_an_fp8_cache_in_one_line(triton_backend):
    assert "fp8" not in triton_backend.kv_cache_dtypes
    case, _, _ = _quantized_case(torch.float8_e4m3fn, [5, 9], [1, 1])
    with pytest.raises(ValueError, match=r"'triton' has no kernel for a torch.float8_e4m3fn KV"):
        triton_backend.paged_decode_attention(
            case["q"], case["k_cache"], case["v_cache"], case["block_tables"],
            case["seq_lens"], SCALE,
        )  # fmt: skip
    key = torch.zeros(1, 2, 16)
    with pytest.raises(ValueError, match="use --attention-backend torch") as exc:
        triton_backend.reshape_and_cache(
            key, key, case["k_cache"], case["v_cache"], torch.tensor([0])
        )
    assert "\n" not in str(exc.value)
