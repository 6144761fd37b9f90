"""--kv-cache-dtype through the engine: the pool's capacity for the same --kv-cache-memory-gb
(real and simulated alike), generation over a quantized cache, one-line errors for
combinations without kernels, and `vllm:cache_config_info` over real HTTP."""

from __future__ import annotations

import pytest
import torch
import triton_interpret  # noqa: F401  (before anything imports triton uninterpreted)
from cbbench.kernels import kv_quant
from cbbench.reference_engine.config.engine_config import KV_CACHE_DTYPES, EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution import kv_cache
from cbbench.reference_engine.execution.cost_model import CostModel, get_hardware
from cbbench.reference_engine.model.config import ModelConfig, preset_config
from cbbench.reference_engine.model.loader import save_random_model
from cbbench.reference_engine.sampling_params import SamplingParams
from server_support import scrape, serve

MEM_GB = 0.004
# head_dim 64 like most real models (tiny's is 16): 2 heads x 64 = hidden 128
D64 = ModelConfig(
    vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
)  # fmt: skip


@pytest.fixture(scope="module")
def d64_dir(tmp_path_factory):
    return str(save_random_model(D64, tmp_path_factory.mktemp("d64")))


def _engine(model: str, kv: str, executor: str = "real", **kw) -> LLMEngine:
    cfg = EngineConfig(model=model, kv_cache_memory_gb=MEM_GB, kv_cache_dtype=kv,
                       executor=executor, hardware="h100", **kw)  # fmt: skip
    return LLMEngine.from_config(cfg)


def test_the_dtype_names_are_one_list():
    assert KV_CACHE_DTYPES == kv_quant.KV_CACHE_DTYPES
    assert kv_cache.KV_SCALE_BYTES == kv_quant.SCALE_BYTES


@pytest.mark.parametrize("model", ["tiny", "d64"])
def test_int8_holds_3_5x_fp32_and_1_8x_bf16_blocks_for_the_same_memory(model, d64_dir):
    """The real ModelRunner's pool for one --kv-cache-memory-gb: tiny (head_dim 16, where a
    2-byte scale gave only 1.78x bf16) and a head_dim-64 checkpoint through the loader."""
    path, head_dim = ("tiny", 16) if model == "tiny" else (d64_dir, 64)
    blocks = {}
    for kv in ("auto", "bf16", "int8", "fp8"):
        real = _engine(path, kv)
        cache = real.executor.kv_cache
        assert cache.nbytes <= MEM_GB * 2**30, "the pool fits the memory asked for"
        assert cache.shape[2] == real.block_manager.num_blocks
        quantized = kv in ("int8", "fp8")
        assert cache.shape[-1] == head_dim + (1 if quantized else 0), "codes + one E8M0 byte"
        sim = _engine(path, kv, executor="sim")
        assert sim.block_manager.num_blocks == real.block_manager.num_blocks, kv
        blocks[kv] = real.block_manager.num_blocks
    assert blocks["int8"] >= 3.5 * blocks["auto"], blocks
    assert blocks["int8"] >= 1.8 * blocks["bf16"], blocks
    assert blocks["fp8"] == blocks["int8"]
    # and no more than the row rule allows: 4D / (D + 1) of fp32's, up to one block's rounding
    assert blocks["int8"] <= 4 * head_dim / (head_dim + 1) * (blocks["auto"] + 1)


@pytest.mark.parametrize("kv", KV_CACHE_DTYPES)
def test_cost_model_counts_the_bytes_the_runner_allocates(kv):
    mc = preset_config("tiny")
    cost = CostModel(mc, get_hardware("h100"), "float32", kv_cache_dtype=kv)
    engine = _engine("tiny", kv)
    cache = engine.executor.kv_cache
    per_block = cache.nbytes // cache.shape[2]
    assert cost.kv_bytes_per_token * 16 == per_block
    assert kv_cache.kv_bytes_per_block(mc, 16, "float32", kv) == per_block


def _greedy(engine: LLMEngine, n: int = 4, max_tokens: int = 12) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i in range(n):
        engine.add_request(f"r{i}", [(7 * i + j) % 500 + 1 for j in range(9 + 5 * i)], params)
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(n)}
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    return out


@pytest.mark.parametrize("kv", ["int8", "fp8", "bf16"])
def test_generation_over_a_quantized_cache(kv):
    engine = _engine("tiny", kv, block_size=4)
    out = _greedy(engine)
    assert all(len(t) == 12 for t in out.values())
    cache = engine.executor.kv_cache
    assert cache.dtype == kv_quant.cache_torch_dtype(kv, torch.float32)
    written = kv_quant.to_compute(cache[0, 0, 1:4], torch.float32)  # blocks a prompt filled
    assert bool(written.abs().sum() > 0), "prompt K went through the quantized write"


def test_a_backend_without_the_kernel_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(
        EngineError, match="backend 'triton' has no kernel for --kv-cache-dtype fp8"
    ) as exc:
        _engine("tiny", "fp8", attention_backend="triton")
    assert "\n" not in str(exc.value)
    monkeypatch.setattr(kv_quant, "fp8_dtype", lambda: None)
    with pytest.raises(EngineError, match="fp8 needs torch.float8_e4m3fn"):
        _engine("tiny", "fp8")
    with pytest.raises(EngineError, match="kv_cache_dtype must be one of auto, bf16, fp8, int8"):
        EngineConfig(kv_cache_dtype="int4")


def test_cache_config_info_names_the_cache_dtype_over_http():
    cfg = EngineConfig(model="tiny", kv_cache_dtype="int8", num_kv_blocks=96)
    with serve(cfg) as (url, _):
        samples = scrape(url)
    key = (
        "vllm:cache_config_info{block_size=16,cache_dtype=int8,enable_prefix_caching=False,"
        "num_gpu_blocks=96}"
    )
    assert samples.get(key) == 1.0, [k for k in samples if "cache_config" in k]
