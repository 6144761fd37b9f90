"""ModelRunner as the engine's Executor: batch-composition invariance, seeded sampling across
batches, KV sizing, and clear errors for what a caller can get wrong."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_bf16_dot, cpu_gemm, cpu_linear_bf16
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cpu_linear import optimize_cpu_linears
from cbbench.reference_engine.execution.model_runner import ModelRunner, default_num_threads
from cbbench.reference_engine.model.config import preset_config
from cbbench.reference_engine.model.loader import random_model, save_random_model
from engine_model_support import generate, make_seq, paged_logits

PROMPTS = [[11, 12, 13, 14, 15, 16, 17], [400, 3], [9] * 19, [100, 200, 300, 400, 500]]


def _runner(**kw) -> ModelRunner:
    return ModelRunner("tiny", num_kv_blocks=kw.pop("num_kv_blocks", 64), block_size=4, **kw)


def test_tokens_do_not_depend_on_batch_composition():
    runner = _runner()
    batched = generate(runner, [make_seq(str(i), p, 10) for i, p in enumerate(PROMPTS)])
    alone = [generate(runner, [make_seq("a", p, 10)])[0] for p in PROMPTS]
    chunked = generate(
        runner, [make_seq(str(i), p, 10) for i, p in enumerate(PROMPTS)], token_budget=3
    )
    assert batched == alone == chunked
    assert len({tuple(t) for t in batched}) == len(PROMPTS)


def test_seeded_sampling_same_tokens_alone_and_batched():
    runner = _runner(seed=3)
    kw = dict(temperature=0.8, top_p=0.95, top_k=50, seed=1234)
    alone = generate(runner, [make_seq("s", PROMPTS[0], 12, **kw)])[0]
    mixed = [make_seq("u0", PROMPTS[1], 12, temperature=1.0)]
    mixed += [make_seq("s", PROMPTS[0], 12, **kw), make_seq("g", PROMPTS[2], 12)]
    assert generate(runner, mixed, token_budget=4)[1] == alone
    other_seed = generate(runner, [make_seq("s", PROMPTS[0], 12, **{**kw, "seed": 99})])[0]
    assert other_seed != alone


def test_same_preset_and_seed_same_weights_and_folder_equals_preset(tmp_path):
    a, b = _runner(seed=7), _runner(seed=7)
    prompts = [make_seq("x", PROMPTS[3], 6)]
    assert generate(a, prompts) == generate(b, [make_seq("x", PROMPTS[3], 6)])
    save_random_model("tiny", tmp_path, seed=7)
    from_folder = ModelRunner(str(tmp_path), num_kv_blocks=64, block_size=4)
    assert generate(from_folder, [make_seq("x", PROMPTS[3], 6)]) == generate(
        a, [make_seq("x", PROMPTS[3], 6)]
    )
    assert from_folder.attention_backend_name == "torch"


def test_prefill_chunk_that_does_not_finish_the_prompt_samples_nothing():
    runner = _runner()
    seq = make_seq("p", PROMPTS[2], 4)
    seq.block_table = [5, 6, 7, 8, 9]
    assert runner.execute([ScheduledChunk(seq, 8)]) == [[]]
    assert runner.execute([]) == []


def test_kv_bytes_per_block_and_cache_shape():
    cfg = preset_config("small")
    # 2 (K, V) x 9 layers x 8 kv heads x 64 dims x 4 bytes x 16 slots
    assert ModelRunner.kv_bytes_per_block(cfg, 16, "float32") == 2 * 9 * 8 * 64 * 4 * 16
    assert ModelRunner.kv_bytes_per_block(cfg, 16, "bfloat16") == 2 * 9 * 8 * 64 * 2 * 16
    runner = _runner(num_kv_blocks=10, dtype="bfloat16")
    assert runner.kv_cache.shape == (2, 2, 10, 4, 2, 16)
    assert runner.kv_cache.dtype == torch.bfloat16
    assert runner.kv_cache.numel() * 2 == 10 * ModelRunner.kv_bytes_per_block(
        runner.model_config, 4, "bfloat16"
    )


def test_caller_errors_are_engine_errors():
    runner = _runner()
    seq = make_seq("short", PROMPTS[0], 4)
    seq.block_table = [1]  # 7 tokens need 2 blocks of 4
    with pytest.raises(EngineError, match="short: 1 KV blocks for 7 tokens"):
        runner.execute([ScheduledChunk(seq, 7)])
    bad = make_seq("bad", [1, 2, 512], 4)
    bad.block_table = [0]
    with pytest.raises(EngineError, match="token id 512 is outside the vocabulary"):
        runner.execute([ScheduledChunk(bad, 3)])
    with pytest.raises(EngineError, match="unknown attention backend 'flash'"):
        _runner(attention_backend="flash")
    with pytest.raises(EngineError, match="num_kv_blocks and block_size must be >= 1"):
        _runner(num_kv_blocks=0)
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="CUDA is not available"):
            _runner(device="cuda")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cpu_linear_layouts_keep_the_logits(dtype):
    base = random_model("tiny", dtype, seed=11)
    want = paged_logits(base, PROMPTS[2])
    fast = random_model("tiny", dtype, seed=11)
    impl = optimize_cpu_linears(fast)
    fp32 = "panels" if cpu_gemm.load() is not None else "onednn"
    # oneDNN's bf16 path needs the CPU's bf16 instructions (avx512_bf16 / AMX); without them
    # the packed layer fails its check against F.linear and the AVX2 bf16 kernel takes over
    # where it builds, else the model keeps column-major
    avx2 = cpu_linear_bf16.load() is not None and cpu_linear_bf16.isa() in ("avx2", "avx512")
    bf16 = ("bf16-dp" if cpu_bf16_dot.isa() == "avx512bf16"
            else "onednn" if torch.ops.mkldnn._is_mkldnn_bf16_supported()
            else "bf16-avx2" if avx2 else "column-major")  # fmt: skip
    assert impl == {"float32": fp32, "bfloat16": bf16, "float16": "column-major"}[dtype]
    assert not any(isinstance(m, torch.nn.Linear) for m in fast.modules()) or impl == "column-major"
    tol = 1e-4 if dtype == "float32" else 3e-2
    torch.testing.assert_close(paged_logits(fast, PROMPTS[2]), want, rtol=tol, atol=tol)
    assert _runner(dtype=dtype).linear_impl == impl


def test_threads_one_for_tiny_models_one_cpu_spared_for_larger(monkeypatch):
    import os

    monkeypatch.delenv("CBBENCH_TORCH_THREADS", raising=False)
    assert default_num_threads(preset_config("tiny")) == 1
    assert default_num_threads(preset_config("small")) == max(1, len(os.sched_getaffinity(0)) - 1)
    before = torch.get_num_threads()
    try:
        _runner()
        assert torch.get_num_threads() == 1
        _runner(num_threads=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_threads_from_the_environment(monkeypatch):
    monkeypatch.setenv("CBBENCH_TORCH_THREADS", "3")
    assert default_num_threads(preset_config("tiny")) == 3
    monkeypatch.setenv("CBBENCH_TORCH_THREADS", "two")
    with pytest.raises(EngineError, match=r"\$CBBENCH_TORCH_THREADS must be a positive integer"):
        default_num_threads(preset_config("small"))


TRITON_SCRIPT = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
from engine_model_support import generate, make_seq
from cbbench.reference_engine.execution.model_runner import ModelRunner
prompts = [[5, 17, 300, 42, 7, 99, 12], [250], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9], [77, 66]]
out = {}
for backend in ("triton", "torch"):
    runner = ModelRunner("tiny", num_kv_blocks=64, block_size=4, attention_backend=backend)
    assert runner.attention_backend_name == backend
    seqs = [make_seq(str(i), p, 5) for i, p in enumerate(prompts)]
    out[backend] = generate(runner, seqs, token_budget=5)  # chunked prefill + decode mixed
print(out["triton"] == out["torch"], len({tuple(t) for t in out["torch"]}))
"""


@pytest.mark.timeout(360)  # the subprocess's own bound is 300 s
def test_model_over_the_triton_backend_matches_torch():
    """The model drives D's Triton kernels (CPU interpreter) the same as the torch path."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", TRITON_SCRIPT, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "4"]


def test_cpu_linear_falls_back_without_onednn(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(cpu_gemm, "_state", {"reason": "test: no panels kernel either"})
    model = random_model("tiny", seed=2)
    want = paged_logits(random_model("tiny", seed=2), PROMPTS[0])
    assert optimize_cpu_linears(model) == "column-major"
    assert model.lm_head.weight.stride() == (1, model.config.vocab_size)
    torch.testing.assert_close(paged_logits(model, PROMPTS[0]), want, rtol=1e-4, atol=1e-5)
