"""Build models: from an HF folder (`config.json` + `*.safetensors`, sharded or not), or with
seeded random weights from a preset / ModelConfig; and save any model as an HF folder.

Every error a user can cause (missing folder, file or tensor, bad shape, unknown dtype) is an
EngineError naming the file or tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model.config import (
    ModelConfig,
    resolve_model_config,
)
from cbbench.reference_engine.model.llama import LlamaForCausalLM
from cbbench.reference_engine.model.mixtral import model_class
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
INDEX_FILE = "model.safetensors.index.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints carry
INIT_STD = 0.02


def resolve_dtype(dtype: str | torch.dtype, cfg: ModelConfig | None = None) -> torch.dtype:
    """ "float32" | "bfloat16" | "float16" (or fp32/bf16/fp16); "auto" = the config's dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        dtype = cfg.torch_dtype if cfg is not None else "float32"
    if dtype not in DTYPES:
        raise EngineError(f"unknown dtype {dtype!r} (choose from float32, bfloat16, float16)")
    return DTYPES[dtype]


resolve_config = resolve_model_config  # the loader's name for it


class _NoInitOnMeta(TorchFunctionMode):
    """Skips torch.nn.init's functions on meta tensors (they hold no values, so nothing is
    lost). On meta, torch runs them through Python reference kernels whose first call imports
    torch._dynamo: ~1.3 s of every engine's start (a `cbbench serve`'s included) for nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def _empty_model(cfg: ModelConfig, dtype: torch.dtype, device: str | torch.device):
    with torch.device("meta"), _NoInitOnMeta():
        model = model_class(cfg)(cfg)
    model = model.to(dtype=dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.init_rope(device)
    return model.eval().requires_grad_(False)


def random_model(
    model: str | ModelConfig,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> LlamaForCausalLM:
    """Seeded random weights (normal, std 0.02; norms 1). Same seed + device = same weights."""
    cfg = resolve_config(model)
    net = _empty_model(cfg, resolve_dtype(dtype, cfg), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                w = torch.empty(p.shape, dtype=torch.float32, device=p.device)
                p.copy_(w.normal_(0.0, INIT_STD, generator=gen))
    return net


def _weight_files(folder: Path) -> dict[Path, list[str] | None]:
    """safetensors file -> the tensor names the index assigns to it (None: all in the file)."""
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise EngineError(f"{index}: not a valid safetensors index ({exc})") from None
        files: dict[Path, list[str] | None] = {}
        for name, fname in weight_map.items():
            files.setdefault(folder / fname, []).append(name)  # type: ignore[union-attr]
        for f in files:
            if not f.exists():
                raise EngineError(f"{f}: listed in {INDEX_FILE} but missing")
        return files
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise EngineError(f"{folder}: no *.safetensors weights found")
    return dict.fromkeys(found)


def load_model(
    path: str | Path, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> LlamaForCausalLM:
    """Load an HF-format folder (Llama, Mistral, Qwen2, Mixtral, Qwen2-MoE) onto `device`
    in `dtype`."""
    folder = Path(path)
    if not folder.is_dir():
        raise EngineError(f"{folder}: not a model folder")
    cfg = ModelConfig.from_file(folder / "config.json")
    net = _empty_model(cfg, resolve_dtype(dtype, cfg), device)
    slices = net.hf_weight_slices()
    loaded: set[str] = set()
    for file, names in _weight_files(folder).items():
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                keys = list(f.keys())
                for name in names if names is not None else keys:
                    if name not in keys:
                        raise EngineError(f"{file}: tensor {name!r} listed in the index is absent")
                    if name.endswith(IGNORED_SUFFIXES) or (
                        name == "lm_head.weight" and cfg.tie_word_embeddings
                    ):
                        continue
                    if name not in slices:
                        raise EngineError(
                            f"{file}: unexpected tensor {name!r} for {cfg.architecture}"
                        )
                    param, start, end = slices[name]
                    tensor = f.get_tensor(name)
                    want = (end - start, *param.shape[1:])
                    if tuple(tensor.shape) != want:
                        raise EngineError(
                            f"{file}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                            f"expected {want} from config.json"
                        )
                    with torch.no_grad():
                        param[start:end].copy_(tensor)
                    loaded.add(name)
        except SafetensorError as exc:
            raise EngineError(f"{file}: unreadable safetensors file ({exc})") from None
    missing = [n for n in slices if n not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise EngineError(f"{folder}: tensor {missing[0]!r} missing from the checkpoint{more}")
    return net


def save_model(
    model: LlamaForCausalLM, path: str | Path, max_shard_bytes: int | None = None
) -> Path:
    """Write `model` as an HF folder: config.json + model.safetensors, or shards of at most
    `max_shard_bytes` each with a model.safetensors.index.json."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    cfg_dict = model.config.to_hf_dict()
    dtype_name = str(model.model.embed_tokens.weight.dtype).removeprefix("torch.")
    cfg_dict.update(hidden_act="silu", torch_dtype=dtype_name)
    (folder / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n", encoding="utf-8")
    tensors = {
        name: p[start:end].detach().to("cpu").clone(memory_format=torch.contiguous_format)
        for name, (p, start, end) in model.hf_weight_slices().items()
    }
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return folder


def save_random_model(
    preset_or_config: str | ModelConfig,
    path: str | Path,
    seed: int = 0,
    dtype: str = "float32",
    max_shard_bytes: int | None = None,
) -> Path:
    """A seeded random model (built on CPU) saved as an HF folder; `load_model` reads it back."""
    return save_model(random_model(preset_or_config, dtype, "cpu", seed), path, max_shard_bytes)
