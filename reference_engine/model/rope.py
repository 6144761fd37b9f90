"""Rotary position embedding (RoPE) with the HF scaling options, as precomputed cos/sin tables.

`rope_scaling` follows HF's config dict: `rope_type` (or legacy `type`) one of
default | linear | dynamic | llama3 | yarn, with that type's parameters. The tables are built
once for a number of positions and grown on demand, so a forward only gathers rows.

`dynamic` (NTK) uses, for position p, the base HF would use for a sequence of length p + 1:
positions inside `max_position_embeddings` are unscaled (as in HF), and each position beyond
gets one fixed rotation, so the result never depends on which other sequences share the batch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from cbbench.reference_engine.errors import EngineError

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_type_of(rope_scaling: dict[str, Any] | None) -> str:
    if not rope_scaling:
        return "default"
    kind = rope_scaling.get("rope_type") or rope_scaling.get("type") or "default"
    if kind not in ROPE_TYPES:
        raise EngineError(
            f"rope_scaling: rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    return kind


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    exps = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (base**exps)


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(
    base: float, dim: int, s: dict[str, Any], max_pos: int
) -> tuple[torch.Tensor, float]:
    orig = int(s.get("original_max_position_embeddings") or max_pos)
    factor = s.get("factor") or max_pos / orig
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        if m and m_all:
            attention_factor = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
        1.0 / pos_freqs
    ) * extrapolation
    return inv_freq, float(attention_factor)


class RotaryEmbedding:
    """cos/sin tables `[positions, head_dim // 2]` (fp32), and the rotation itself."""

    def __init__(
        self,
        head_dim: int,
        base: float,
        max_position_embeddings: int,
        rope_scaling: dict[str, Any] | None = None,
        device: str | torch.device = "cpu",
        initial_positions: int = 4096,
    ) -> None:
        assert head_dim % 2 == 0, "RoPE needs an even head_dim"
        self.head_dim = head_dim
        self.base = base
        self.max_position_embeddings = max_position_embeddings
        self.scaling = dict(rope_scaling or {})
        self.rope_type = rope_type_of(rope_scaling)
        self.device = torch.device(device)
        self.attention_scaling = 1.0
        inv_freq = _base_inv_freq(base, head_dim)
        if self.rope_type == "linear":
            inv_freq = inv_freq / float(self.scaling["factor"])
        elif self.rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, self.scaling)
        elif self.rope_type == "yarn":
            inv_freq, self.attention_scaling = _yarn_inv_freq(
                base, head_dim, self.scaling, max_position_embeddings
            )
        self.inv_freq = inv_freq
        self.cos = torch.empty(0, head_dim // 2, device=self.device)
        self.sin = torch.empty(0, head_dim // 2, device=self.device)
        self._grow(min(initial_positions, max_position_embeddings))

    def _freqs(self, positions: torch.Tensor) -> torch.Tensor:
        """Angles [len(positions), head_dim // 2] in fp32 for these positions."""
        pos = positions.to(torch.float32)
        if self.rope_type != "dynamic":
            return pos[:, None] * self.inv_freq[None, :]
        factor, max_pos, dim = (
            float(self.scaling["factor"]),
            self.max_position_embeddings,
            self.head_dim,
        )
        seq_len = torch.clamp(positions + 1, min=max_pos).to(torch.float64)
        bases = self.base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        exps = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
        inv = 1.0 / (bases.to(torch.float32)[:, None] ** exps[None, :])
        unscaled = positions < max_pos
        inv[unscaled] = self.inv_freq
        return pos[:, None] * inv

    def _grow(self, num_positions: int) -> None:
        start = self.cos.shape[0]
        if num_positions <= start:
            return
        freqs = self._freqs(torch.arange(start, num_positions))
        cos = (freqs.cos() * self.attention_scaling).to(self.device)
        sin = (freqs.sin() * self.attention_scaling).to(self.device)
        self.cos = torch.cat([self.cos, cos])
        self.sin = torch.cat([self.sin, sin])

    def cos_sin(self, positions: torch.Tensor, max_position: int) -> tuple[torch.Tensor, ...]:
        """Rows for `positions` (any shape); `max_position` is their maximum (host int)."""
        if max_position >= self.cos.shape[0]:
            self._grow(max(max_position + 1, 2 * self.cos.shape[0]))
        return self.cos[positions], self.sin[positions]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, H, D] (half-split layout, as HF's rotate_half) by cos/sin [T, D/2]."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
