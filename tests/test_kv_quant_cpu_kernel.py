"""The C++ int8 KV decode kernel (kernels/csrc/cpu_attention_quant.cpp, kernels/cpu_kv_attention.py)
against the oracle in kernels/reference.py over the dequantized cache, its row format (the
scale byte(s) decoded exactly as kernels/kv_quant.py writes them), its one-line errors, its
place in the torch backend, and the engine end to end on `tiny` with either path.

Tolerance: fp32 compute on both sides, only the summation order differs, so within 1e-5
relative, measured against the output's largest magnitude (an output element that cancels to
near zero still carries the rounding of the V terms it summed; its own relative error is
unbounded for any kernel). Exact (0 error) where one token makes the softmax exactly 1.
"""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_kv_attention, kv_quant
from cbbench.kernels.reference import (
    make_paged_case,
    ref_dequantize_cache,
    ref_paged_decode_attention,
    ref_quantize_cache,
)
from cbbench.kernels.torch_backend import TorchAttentionBackend
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.sampling_params import SamplingParams

_REASON = cpu_kv_attention.unavailable_reason()
if _REASON is not None:
    print(f"int8 KV C++ kernel unavailable: {_REASON}")
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"int8 KV C++ kernel: {_REASON}")

RTOL = 1e-5


def assert_close(out: torch.Tensor, ref: torch.Tensor, msg: str = "") -> None:
    torch.testing.assert_close(
        out, ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()), msg=msg or None
    )


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    saved = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(saved)


def int8_case(seq_lens, block_size, num_kv_heads, group, head_dim, seed=0, shared=0):
    """Shuffled block tables from make_paged_case; the first `shared` blocks of every table
    replaced by sequence 0's (a shared prefix, as prefix caching hands out); rows scaled by
    2**k (K: k in -2..2, V: -4..4) so the E8M0 bytes vary, then quantized by kv_quant (the
    engine's write). Wider K magnitudes make the softmax ill-conditioned (scores in the
    thousands: 1e-7 relative on a score is 1e-4 on its weight) for any fp32 kernel."""
    c = make_paged_case(seq_lens, [1] * len(seq_lens), block_size, num_kv_heads, group,
                        head_dim=head_dim, seed=seed)  # fmt: skip
    gen = torch.Generator().manual_seed(seed + 1)
    tables, lens = c["block_tables"], c["seq_lens"]
    for b in range(1, len(seq_lens)):
        n = min(shared, -(-int(lens[b]) // block_size) - 1, -(-int(lens[0]) // block_size) - 1)
        if n > 0:
            tables[b, :n] = tables[0, :n]
    caches = []
    for name, k in (("k_cache", 2), ("v_cache", 4)):
        x = c[name]
        mag = torch.randint(-k, k + 1, (*x.shape[:-1], 1), generator=gen).float().exp2()
        caches.append(kv_quant.quantize(x * mag, torch.int8))
    return c["q"], caches[0], caches[1], tables, lens


CASES = [
    # seq_lens, block_size, num_kv_heads, group, head_dim
    ([1], 16, 2, 2, 16),  # one token
    ([1, 15, 16, 17, 31, 32, 33, 300], 16, 2, 4, 16),  # across block boundaries, GQA, tiny's D
    ([300, 129, 64], 16, 4, 1, 64),  # MHA, exact blocks
    ([5, 200, 77, 1], 16, 2, 4, 128),  # GQA, head_dim 128
    ([250, 3], 8, 8, 1, 128),  # MHA, head_dim 128, few sequences: heads split between threads
    ([40, 41, 2, 299, 100, 7], 1, 1, 8, 64),  # block size 1, MQA
]


@pytest.mark.parametrize("seq_lens,block_size,num_kv_heads,group,head_dim", CASES)
def test_matches_the_oracle_over_the_dequantized_cache(
    threads, seq_lens, block_size, num_kv_heads, group, head_dim
):
    q, kc, vc, bt, sl = int8_case(seq_lens, block_size, num_kv_heads, group, head_dim,
                                  seed=threads, shared=3)  # fmt: skip
    scale = head_dim**-0.5
    out = cpu_kv_attention.paged_decode_attention(q, kc, vc, bt, sl, scale)
    assert out.shape == q.shape and out.dtype == torch.float32
    ref = ref_paged_decode_attention(
        q, kv_quant.dequantize(kc), kv_quant.dequantize(vc), bt, sl, scale
    )
    assert_close(out, ref)


def test_random_batches(threads):
    """B 1..8, lengths 1..300, shuffled tables with shared prefixes, head_dim 16/64/128."""
    gen = torch.Generator().manual_seed(7 + threads)
    for i in range(6):
        b = int(torch.randint(1, 9, (1,), generator=gen))
        lens = torch.randint(1, 301, (b,), generator=gen).tolist()
        head_dim = (16, 64, 128)[i % 3]
        hkv, group = ((1, 4), (2, 2), (4, 1))[i % 3]
        q, kc, vc, bt, sl = int8_case(lens, 16, hkv, group, head_dim, seed=i, shared=i % 4)
        out = cpu_kv_attention.paged_decode_attention(q, kc, vc, bt, sl, 0.2)
        ref = ref_paged_decode_attention(
            q, kv_quant.dequantize(kc), kv_quant.dequantize(vc), bt, sl, 0.2
        )
        assert_close(out, ref, msg=f"{lens} D {head_dim}")


def test_oracle_quantized_cache_too():
    """The cache written by the oracle's row-by-row quantization, dequantized by the oracle."""
    c = make_paged_case([20, 9, 33], [1] * 3, 4, 2, 2, head_dim=16, seed=3)
    kc = ref_quantize_cache(c["k_cache"], torch.int8)
    vc = ref_quantize_cache(c["v_cache"], torch.int8)
    args = (c["q"], kc, vc, c["block_tables"], c["seq_lens"])
    out = cpu_kv_attention.paged_decode_attention(*args, 0.25)
    ref = ref_paged_decode_attention(
        c["q"], ref_dequantize_cache(kc), ref_dequantize_cache(vc), *args[3:], 0.25
    )
    assert_close(out, ref)


def _one_token_rows(scale_bytes: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """A cache of len(codes) blocks of one token and one head: codes then the scale bytes."""
    rows = torch.cat([codes.view(torch.uint8), scale_bytes], dim=1).view(torch.int8)
    return rows[:, None, None, :].contiguous()


def _attend_one_token(v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """With one token softmax is exactly 1: the output is that token's dequantized V row
    (K: the same rows with zero codes, so every score is a finite 0)."""
    n = v.shape[0]
    q = torch.randn(n, 1, head_dim)
    k = v.clone()
    k[..., :head_dim] = 0
    tables = torch.arange(n, dtype=torch.int32)[:, None]
    lens = torch.ones(n, dtype=torch.int32)
    return cpu_kv_attention.paged_decode_attention(q, k, v, tables, lens, 1.0)[:, 0]


def test_every_e8m0_byte_decodes_as_kv_quant_does():
    """Rows with e = 1..254 (2**-126 .. 2**127) and codes +-1..127 come out as
    kv_quant.dequantize's values bit for bit."""
    assert kv_quant.SCALE_BYTES == 1, "kv_quant's layout changed: update this test"
    head_dim = 16
    e = torch.arange(1, 255, dtype=torch.uint8)[:, None]
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(-127, 128, (e.shape[0], head_dim), generator=gen).to(torch.int8)
    codes[e[:, 0] >= 248] = codes[e[:, 0] >= 248].clamp(-1, 1)  # stay finite at 2**121+
    v = _one_token_rows(e, codes)
    out = _attend_one_token(v, head_dim)
    torch.testing.assert_close(out, kv_quant.dequantize(v[:, 0, 0]), rtol=0, atol=0)


def test_a_two_byte_row_reads_an_fp16_scale():
    """The earlier layout (codes + fp16 scale), chosen by the row width D + 2."""
    head_dim = 16
    scales = torch.tensor([1e-3, 0.5, 1.0, 3.0, 60000.0], dtype=torch.float16)[:, None]
    codes = torch.randint(-127, 128, (5, head_dim), generator=torch.Generator().manual_seed(1))
    v = _one_token_rows(scales.view(torch.uint8), codes.to(torch.int8))
    out = _attend_one_token(v, head_dim)
    torch.testing.assert_close(out, codes.float() * scales.float(), rtol=0, atol=0)


def test_bad_inputs_are_one_line_errors():
    q, kc, vc, bt, sl = int8_case([20, 30], 4, 2, 2, 16)
    bad = bt.clone()
    bad[1, 3] = kc.shape[0]
    with pytest.raises(RuntimeError, match="block .* outside the pool of") as exc:
        cpu_kv_attention.paged_decode_attention(q, kc, vc, bad, sl, 0.25)
    assert "\n" not in str(exc.value).strip().splitlines()[0]
    long = sl.clone()
    long[0] = bt.shape[1] * 4 + 1
    with pytest.raises(RuntimeError, match="sequence 0 has length"):
        cpu_kv_attention.paged_decode_attention(q, kc, vc, bt, long, 0.25)
    with pytest.raises(RuntimeError, match="expected 16 codes \\+ 1 \\(E8M0\\) or 2"):
        cpu_kv_attention.paged_decode_attention(q, kc[..., :-2], vc[..., :-2], bt, sl, 0.25)


def test_the_backend_runs_it_for_int8_decode_and_says_so(monkeypatch):
    calls = []
    real = cpu_kv_attention.paged_decode_attention
    monkeypatch.setattr(cpu_kv_attention, "paged_decode_attention",
                        lambda *a: calls.append(a[1].dtype) or real(*a))  # fmt: skip
    be = TorchAttentionBackend(torch.device("cpu"))
    assert be.describe()["decode_kernel_int8"] == "cpp"
    q, kc, vc, bt, sl = int8_case([20, 33, 1], 16, 2, 2, 64)
    ref = ref_paged_decode_attention(
        q, kv_quant.dequantize(kc), kv_quant.dequantize(vc), bt, sl, 0.25
    )
    out = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    assert_close(out, ref)
    assert calls == [torch.int8]
    fp8 = kv_quant.fp8_dtype()
    if fp8 is not None:  # fp8 (and bf16) keep the gather path
        c = make_paged_case([20], [1], 16, 2, 2, head_dim=64)
        kf, vf = kv_quant.quantize(c["k_cache"], fp8), kv_quant.quantize(c["v_cache"], fp8)
        be.paged_decode_attention(c["q"], kf, vf, c["block_tables"], c["seq_lens"], 0.25)
        assert calls == [torch.int8]
    be.quant_kernel = False  # forced: the torch gather path, same answer
    assert be.describe()["decode_kernel_int8"] == "gather"
    gathered = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    assert calls == [torch.int8]
    assert_close(gathered, ref)


def _greedy(kernel: bool, monkeypatch) -> tuple[dict[str, list[int]], int]:
    calls = []
    real = cpu_kv_attention.paged_decode_attention
    monkeypatch.setattr(cpu_kv_attention, "paged_decode_attention",
                        lambda *a: calls.append(1) or real(*a))  # fmt: skip
    cfg = EngineConfig(model="tiny", kv_cache_dtype="int8", num_kv_blocks=128, block_size=4)
    engine = LLMEngine.from_config(cfg)
    engine.executor.backend.quant_kernel = kernel
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"r{i}", [(7 * i + j) % 500 + 1 for j in range(9 + 6 * i)], params)
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(4)}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    return out, len(calls)


def test_engine_greedy_tokens_equal_with_either_path(monkeypatch):
    """tiny with --kv-cache-dtype int8: the C++ kernel's greedy tokens are the torch path's."""
    cpp, cpp_calls = _greedy(True, monkeypatch)
    torch_path, torch_calls = _greedy(False, monkeypatch)
    assert cpp_calls > 0 and torch_calls == 0
    assert all(len(t) == 16 for t in cpp.values())
    assert cpp == torch_path


def test_an_int8_engine_loads_the_kernel_at_start_up(monkeypatch):
    """The kernel's first build (about a minute) happens while the engine starts, before it
    serves, not inside a request's first decode step (it would sit in that request's TTFT)."""
    loads = []
    real = cpu_kv_attention.load
    monkeypatch.setattr(cpu_kv_attention, "load", lambda: loads.append(1) or real())
    LLMEngine.from_config(EngineConfig(model="tiny", kv_cache_dtype="int8", num_kv_blocks=16))
    assert loads
    loads.clear()
    LLMEngine.from_config(EngineConfig(model="tiny", num_kv_blocks=16))  # fp32 KV: no build
    assert not loads


@pytest.mark.slow
def test_the_scalar_fallback_builds_and_matches_the_oracle():
    """The same source compiled without AVX2/FMA (a CPU the intrinsics do not target): the
    plain loops give the same answers (builds a second module, about a minute)."""
    from cbbench.kernels import cpu_gemm

    mod = cpu_gemm._build(extra_cflags=["-mno-avx2", "-mno-fma"],
                          name="cbbench_cpu_kv_kernels_scalar",
                          sources=cpu_kv_attention.SOURCES)  # fmt: skip
    assert mod.isa() == "scalar"
    q, kc, vc, bt, sl = int8_case([1, 17, 300, 64], 16, 2, 4, 64, seed=5, shared=2)
    out = mod.paged_decode_attention_int8(q, kc, vc, bt, sl, 0.125)
    ref = ref_paged_decode_attention(
        q, kv_quant.dequantize(kc), kv_quant.dequantize(vc), bt, sl, 0.125
    )
    assert_close(out, ref)
