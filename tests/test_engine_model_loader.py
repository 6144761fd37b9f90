"""Loader: random models by preset, HF-folder round trips (single file and sharded), and
one clear EngineError per broken checkpoint, naming the file or tensor."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.model.config import ModelConfig, preset_config
from cbbench.reference_engine.model.loader import (
    INDEX_FILE,
    load_model,
    random_model,
    resolve_dtype,
    save_model,
    save_random_model,
)
from engine_model_support import paged_logits
from safetensors.torch import load_file, save_file

TOKENS = [4, 100, 7, 300, 2, 9, 77, 1, 450, 12]


def _logits(model) -> torch.Tensor:
    return paged_logits(model, TOKENS)


def test_random_model_is_seeded_and_preset_shaped():
    a, b, c = (
        random_model("tiny", seed=1),
        random_model("tiny", seed=1),
        random_model("tiny", seed=2),
    )
    assert torch.equal(_logits(a), _logits(b))
    assert not torch.equal(_logits(a), _logits(c))
    cfg = preset_config("tiny")
    n = sum(p.numel() for p in a.parameters())
    assert n == cfg.num_params()


@pytest.mark.parametrize("shard_bytes", [None, 40_000])
def test_save_load_round_trip_identical_logits(tmp_path, shard_bytes):
    model = random_model("tiny", seed=3)
    save_random_model("tiny", tmp_path, seed=3, max_shard_bytes=shard_bytes)
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    if shard_bytes is None:
        assert shards == ["model.safetensors"]
        assert not (tmp_path / INDEX_FILE).exists()
    else:
        assert len(shards) > 2 and (tmp_path / INDEX_FILE).exists()
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    assert torch.equal(_logits(loaded), _logits(model))


def test_hf_tensor_names_and_tied_head(tmp_path):
    cfg = dataclasses.replace(preset_config("tiny"), tie_word_embeddings=True)
    save_random_model(cfg, tmp_path)
    names = set(load_file(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in names
    assert {"model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight"} <= names
    loaded = load_model(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight


def test_transformers_reads_our_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = random_model("tiny", seed=5)
    save_model(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([TOKENS])).logits[0, -1:]
    torch.testing.assert_close(_logits(model), want, rtol=1e-4, atol=1e-5)


def test_dtype_conversion_on_load(tmp_path):
    save_random_model("tiny", tmp_path, seed=0)
    bf = load_model(tmp_path, dtype="bfloat16")
    assert bf.lm_head.weight.dtype == torch.bfloat16
    assert _logits(bf).dtype == torch.float32
    assert resolve_dtype("fp16") == torch.float16
    with pytest.raises(EngineError, match="unknown dtype 'float8'"):
        resolve_dtype("float8")


@pytest.fixture
def ckpt(tmp_path):
    save_random_model("tiny", tmp_path, seed=0)
    return tmp_path


def _rewrite(path, mutate) -> None:
    tensors = load_file(path / "model.safetensors")
    mutate(tensors)
    save_file(tensors, path / "model.safetensors")


def test_error_missing_tensor(ckpt):
    _rewrite(ckpt, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(EngineError, match=r"'model\.layers\.1\.mlp\.down_proj\.weight' missing"):
        load_model(ckpt)


def test_error_bad_shape(ckpt):
    def shrink(t):
        t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 64)

    _rewrite(ckpt, shrink)
    with pytest.raises(EngineError, match=r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' has shape \(3, 64\), expected \(64, 64\)"):  # fmt: skip
        load_model(ckpt)


def test_error_unexpected_tensor(ckpt):
    def add(t):
        t["model.layers.0.mlp.gate_proj.bias"] = torch.zeros(128)

    _rewrite(ckpt, add)
    with pytest.raises(EngineError, match="unexpected tensor 'model.layers.0.mlp.gate_proj.bias'"):
        load_model(ckpt)


def test_error_missing_files(tmp_path, ckpt):
    with pytest.raises(EngineError, match="not a model folder"):
        load_model(tmp_path / "nope")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(EngineError, match="no \\*.safetensors weights found"):
        load_model(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(EngineError, match="config.json: no such file"):
        load_model(ckpt)


def test_error_missing_shard_and_corrupt_file(tmp_path):
    save_random_model("tiny", tmp_path, seed=0, max_shard_bytes=40_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (tmp_path / victim).write_bytes(b"\x10\x00garbage")
    with pytest.raises(EngineError, match=f"{victim}: unreadable safetensors file"):
        load_model(tmp_path)
    (tmp_path / victim).unlink()
    with pytest.raises(EngineError, match=f"{victim}: listed in {INDEX_FILE} but missing"):
        load_model(tmp_path)


def test_error_unknown_model_and_architecture(tmp_path):
    with pytest.raises(EngineError, match="neither a preset"):
        ModelRunner("no-such-model", num_kv_blocks=4, block_size=4)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(EngineError, match="'GPT2LMHeadModel' is not supported"):
        load_model(tmp_path)


def test_transformers5_rope_parameters_config():
    cfg = ModelConfig.from_hf_dict(
        {
            "vocab_size": 8,
            "hidden_size": 8,
            "intermediate_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0},
        }
    )
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling == {"rope_type": "llama3", "factor": 8.0}
