"""Triton kernels against the oracle, run by the Triton interpreter on CPU tensors.

TRITON_INTERPRET=1 must be set before the kernel modules are imported (triton.jit reads it at
decoration time), so this module imports them through tests/triton_interpret.py, which sets
it around the import and restores the environment
(an autouse fixture sets it again around each test, since the interpreter reads it while
running too), and asserts the kernels really are interpreted. A subprocess test proves the same wiring
from a fresh interpreter.

Tolerances against the fp32 oracle: fp32 1e-5 (only the summation order differs); fp16 5e-3
(probabilities and output rounded to fp16, 11 significant bits); bf16 2e-2 absolute and
relative (output rounded to bf16: 8 bits). fp16 runs the kernels' native 16-bit tl.dot path;
fp32 and bf16 the fp32-upcast one (the interpreter's bf16 tl.dot is wrong; on CUDA, bf16 takes
the native path, checked by bench_gpu).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import triton_interpret  # noqa: F401  (imports triton and the kernels under TRITON_INTERPRET=1)
from cbbench.kernels import (
    get_attention_backend,
    triton_attention,
    triton_cache,
)
from cbbench.kernels.reference import (
    make_paged_case,
    ref_paged_attention,
    ref_paged_decode_attention,
    ref_reshape_and_cache,
)
from cbbench.kernels.triton_backend import TritonAttentionBackend
from triton.runtime.interpreter import InterpretedFunction


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    """The interpreter also reads TRITON_INTERPRET while kernels run, not only at import."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SCALE = 0.25


def test_kernels_are_interpreted():
    for kernel in (
        triton_attention._decode_split_kernel,
        triton_attention._decode_merge_kernel,
        triton_attention._prefill_kernel,
        triton_cache._reshape_and_cache_kernel,
    ):
        assert isinstance(kernel, InterpretedFunction), kernel


# (seq_lens, query_lens, block_size, num_kv_heads, group[, head_dim])
PREFILL_GRID = [
    ([7], [7], 1, 2, 1),  # block size 1
    ([37, 5], [37, 5], 16, 1, 4),  # lengths off the block size, GQA 4
    ([40, 23], [8, 23], 16, 2, 8),  # chunked prefill on a 32-token cached prefix, GQA 8
    ([70, 9, 33, 1], [1, 3, 1, 1], 32, 2, 4),  # mixed decode + chunk batch, block 32
    ([100], [90], 64, 1, 1),  # block 64; the query tile straddles the cached prefix
    ([19, 6], [19, 2], 4, 1, 2, 8),  # head_dim 8: padded to the 16 tl.dot needs
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PREFILL_GRID)
def test_paged_attention_matches_oracle(case, dtype):
    c = make_paged_case(*case, dtype=dtype)
    out = triton_attention.paged_prefill_attention(
        c["q"],
        c["k_cache"],
        c["v_cache"],
        c["block_tables"],
        c["seq_lens"],
        c["query_start_loc"],
        SCALE,
        block_m=32,
        block_n=32,
    )
    ref = ref_paged_attention(
        c["q"],
        c["k_cache"],
        c["v_cache"],
        c["block_tables"],
        c["seq_lens"],
        c["query_start_loc"],
        SCALE,
    )
    assert out.dtype == dtype and out.shape == c["q"].shape
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


# (seq_lens, block_size, num_kv_heads, group, num_splits)
DECODE_GRID = [
    ([1, 17, 100], 1, 2, 1, 1),
    ([130, 5, 64], 16, 2, 4, 3),  # split-KV: seq 5 leaves splits 1..2 empty
    ([300, 33], 16, 1, 8, 5),
    ([77, 200], 64, 4, 1, 2),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE_GRID)
def test_decode_matches_oracle(case, dtype):
    seq_lens, block_size, num_kv_heads, group, num_splits = case
    c = make_paged_case(seq_lens, [1] * len(seq_lens), block_size, num_kv_heads, group, dtype=dtype)
    args = (c["q"], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"], SCALE)
    out = triton_attention.paged_decode_attention(*args, num_splits=num_splits, block_n=32)
    ref = ref_paged_decode_attention(*args)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_split_count_does_not_change_the_answer():
    c = make_paged_case([250, 90], [1, 1], 16, 2, 4)
    args = (c["q"], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"], SCALE)
    one = triton_attention.paged_decode_attention(*args, num_splits=1, block_n=16)
    many = triton_attention.paged_decode_attention(*args, num_splits=8, block_n=16)
    torch.testing.assert_close(one, many, atol=1e-6, rtol=1e-6)


HUGE_POOL = 2**23 + 64  # blocks of 16 x 1 x 16 = 256 elements: 2**31 + 16384 in all


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_huge_pool_uses_int64_offsets(dtype):
    """Block ids near the end of a pool past 2**31 elements (only touched pages are real)."""
    c = make_paged_case([45, 20], [5, 20], 16, 1, 4, dtype=dtype, num_blocks=HUGE_POOL)
    assert c["k_cache"].numel() > 2**31 and int(c["block_tables"].max()) == HUGE_POOL - 1
    keys = ("q", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc")
    args = [c[k] for k in keys]
    ref = ref_paged_attention(*args, SCALE)
    out = triton_attention.paged_prefill_attention(*args, SCALE, block_m=16, block_n=16)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])
    last = torch.tensor([4, 24])  # each sequence's final query token, decoded alone
    dec = triton_attention.paged_decode_attention(
        c["q"][last], *args[1:5], SCALE, num_splits=2, block_n=16
    )
    torch.testing.assert_close(dec.float(), ref[last], atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_matches_oracle(dtype):
    gen = torch.Generator().manual_seed(7)
    kc = torch.zeros(9, 16, 2, 24, dtype=dtype)  # head_dim 24: not a power of two
    vc = torch.zeros_like(kc)
    key = torch.randn(7, 2, 24, generator=gen).to(dtype)
    value = torch.randn(7, 2, 24, generator=gen).to(dtype)
    slots = torch.tensor([0, 15, 16, -1, 143, 77, -5], dtype=torch.int64)
    triton_cache.reshape_and_cache(key, value, kc, vc, slots)
    rk, rv = torch.zeros_like(kc), torch.zeros_like(vc)
    ref_reshape_and_cache(key, value, rk, rv, slots)
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    assert int((kc != 0).any(dim=(2, 3)).sum()) == 5


def test_reshape_and_cache_huge_pool():
    kc = torch.empty(HUGE_POOL, 16, 1, 16, dtype=torch.bfloat16)
    vc = torch.empty_like(kc)
    key = torch.randn(2, 1, 16).to(torch.bfloat16)
    slots = torch.tensor([HUGE_POOL * 16 - 1, 3], dtype=torch.int64)
    triton_cache.reshape_and_cache(key, -key, kc, vc, slots)
    assert torch.equal(kc[HUGE_POOL - 1, 15], key[0]) and torch.equal(vc[0, 3], -key[1])


def test_selector_forced_triton_on_cpu_calls_the_kernels(monkeypatch):
    """Dispatch wiring: with the interpreter on, 'triton' on CPU tensors runs these kernels."""
    calls = []
    for name in ("paged_decode_attention", "paged_prefill_attention"):
        real = getattr(triton_attention, name)

        def spy(*a, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(*a, **kw)

        monkeypatch.setattr(triton_attention, name, spy)
    be = get_attention_backend("triton", "cpu")
    assert isinstance(be, TritonAttentionBackend) and be.describe()["interpreted"] is True
    c = make_paged_case([20, 9], [4, 1], 8, 2, 2)
    keys = ("q", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc")
    out = be.paged_attention(*[c[k] for k in keys], SCALE)
    dec = be.paged_decode_attention(
        c["q"][[3, 4]], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"], SCALE
    )
    assert calls == ["paged_prefill_attention", "paged_decode_attention"]
    torch.testing.assert_close(dec, out[[3, 4]], atol=1e-5, rtol=1e-5)


def test_selector_refuses_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="'triton' cannot run: Triton kernels need a CUDA"):
        get_attention_backend("triton", "cpu")
    assert get_attention_backend("auto", "cpu").name == "torch"


FRESH = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from cbbench.kernels import available_backends, get_attention_backend
from cbbench.kernels.reference import make_paged_case, ref_paged_decode_attention
from cbbench.kernels import triton_attention
be = get_attention_backend("triton", "cpu")
c = make_paged_case([33, 7], [1, 1], 16, 2, 4)
args = (c["q"], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"], 0.5)
err = (be.paged_decode_attention(*args) - ref_paged_decode_attention(*args)).abs().max()
print(be.name, type(triton_attention._decode_split_kernel).__name__, available_backends("cpu"),
      get_attention_backend("auto", "cpu").name, float(err) < 1e-5)
"""


def test_fresh_interpreter_dispatch():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "triton",
        "InterpretedFunction",
        "['torch',",
        "'triton']",
        "torch",
        "True",
    ]


LATE_ENV = """
import os, torch
import torch._dynamo  # imports triton: its standard library is decorated compiled
os.environ["TRITON_INTERPRET"] = "1"
from cbbench.kernels import available_backends, get_attention_backend
try:
    get_attention_backend("triton", "cpu")
except ValueError as e:
    print(available_backends("cpu"), "|", e)
"""


def test_interpreter_set_after_triton_was_imported_is_one_clear_error():
    """Without the check every kernel fails inside the interpreter with "Cannot call
    @triton.jit'd outside of the scope of a kernel" (triton 3.9)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", LATE_ENV], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    backends, msg = proc.stdout.strip().split(" | ")
    assert backends == "['torch']"
    assert "triton was imported before TRITON_INTERPRET=1 was set" in msg and "\n" not in msg

NO_TRITON = """
import sys
sys.modules["triton"] = None  # as if not installed
from cbbench.kernels import available_backends, get_attention_backend
print(available_backends("cpu"), get_attention_backend("auto", "cpu").name)
try:
    get_attention_backend("triton", "cpu")
except ValueError as e:
    print(e)
"""


def test_import_and_torch_path_without_triton():
    proc = subprocess.run(
        [sys.executable, "-c", NO_TRITON], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "['torch'] torch"
    assert "'triton' package is not installed" in lines[1]


def test_host_side_upper_bounds_give_the_same_answer():
    """On a GPU the backend launches from bounds (table width, total tokens), never a sync."""
    c = make_paged_case([150, 40, 3], [6, 1, 3], 16, 2, 4)
    keys = ("q", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc")
    args = [c[k] for k in keys]
    ref = ref_paged_attention(*args, SCALE)
    out = triton_attention.paged_prefill_attention(
        *args, SCALE, max_query_len=c["q"].shape[0], block_m=16, block_n=32
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    last = torch.tensor([5, 6, 9])
    bound = c["block_tables"].shape[1] * 16  # 11 blocks: 176 > 150
    dec = triton_attention.paged_decode_attention(
        c["q"][last], *args[1:5], SCALE, max_seq_len=bound, num_splits=4, block_n=32
    )
    torch.testing.assert_close(dec, ref[last], atol=1e-5, rtol=1e-5)


def test_dot_paths_chosen_per_dtype():
    """fp16 runs the native 16-bit tl.dot here, so the path CUDA uses for bf16 is tested."""
    f32 = triton_attention._dot_f32
    assert f32(torch.zeros(1)) and f32(torch.zeros(1, dtype=torch.bfloat16))
    assert not f32(torch.zeros(1, dtype=torch.float16))


BROKEN_TRITON = """
import os
os.environ["TRITON_INTERPRET"] = "1"
from cbbench.kernels import get_attention_backend
print(get_attention_backend("auto", "cpu").name)
try:
    get_attention_backend("triton", "cpu")
except ValueError as e:
    print(e)
"""


def test_broken_triton_install_is_one_clear_error(tmp_path):
    fake = tmp_path / "triton"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('libcuda missing (test stand-in)')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", BROKEN_TRITON], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "torch",
        "attention backend 'triton' cannot run: importing triton failed: "
        "libcuda missing (test stand-in)",
    ]


def _random_case(seed: int) -> tuple:
    """A random mixed batch: decodes, full prefills and chunks on cached prefixes."""
    gen = torch.Generator().manual_seed(seed)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=gen))]  # noqa: E731
    block_size, group, num_kv_heads = pick([1, 8, 16, 32, 128]), pick([1, 2, 4, 8]), pick([1, 2])
    seq_lens, qlens = [], []
    for _ in range(int(torch.randint(1, 6, (1,), generator=gen))):
        n = int(torch.randint(1, 600, (1,), generator=gen))
        seq_lens.append(n)
        qlens.append(pick([1, n, max(1, n // 3)]))
    return seq_lens, qlens, block_size, num_kv_heads, group


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(12))
def test_random_batches_match_oracle(seed, dtype):
    case = _random_case(seed)
    c = make_paged_case(*case, head_dim=32, dtype=dtype, seed=seed)
    keys = ("q", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc")
    args = [c[k] for k in keys]
    ref = ref_paged_attention(*args, SCALE)
    out = triton_attention.paged_prefill_attention(*args, SCALE)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])
    last = (c["query_start_loc"][1:] - 1).long()  # each sequence's final query, decoded alone
    dec = triton_attention.paged_decode_attention(c["q"][last], *args[1:5], SCALE)
    torch.testing.assert_close(dec.float(), ref[last], atol=TOL[dtype], rtol=TOL[dtype])
