"""One request's KV as it travels from a prefill worker to a decode worker.

`data` holds the request's blocks as the cache stores them: `[layers, 2, blocks, block_size,
kv_heads, row]` in the cache's storage dtype (row = head_dim, + the one-byte scale of an
int8 / fp8 row), whole blocks, so the decode worker copies them into its own pool with one
indexed write. Only the first `num_tokens` positions are valid; the rest of the last block
is whatever the prefill worker's pool held (the decode step overwrites it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from cbbench.reference_engine.errors import EngineError


class KVTransferError(EngineError):
    """A transfer failed: the producer is gone, the payload expired or does not fit."""


@dataclass
class KVLayout:
    """What both sides must agree on for a block to mean the same thing."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    row_width: int  # elements per (token, head) row, a quantized row's scale included
    dtype: str  # the cache's torch storage dtype, e.g. "torch.float32", "torch.int8"

    def check(self, other: KVLayout) -> None:
        """KVTransferError naming the first field on which `other` (the received) differs."""
        for name, mine in asdict(self).items():
            theirs = getattr(other, name)
            if mine != theirs:
                raise KVTransferError(
                    f"KV layout mismatch: {name} is {theirs} at the prefill worker but "
                    f"{mine} here (both sides need the same model, --block-size and "
                    f"--kv-cache-dtype)"
                )


@dataclass
class KVPayload:
    layout: KVLayout
    num_tokens: int  # prompt tokens whose K/V the payload holds
    first_token_id: int  # the token the prefill worker sampled after them
    data: bytes | None  # None: the simulator's payload (priced by the link, never moved)

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.layout.block_size)

    @property
    def nbytes(self) -> int:
        return len(self.data) if self.data is not None else 0

    def header(self) -> str:
        """Everything but the data, one line of JSON (an HTTP header of the pull)."""
        return json.dumps(
            {"layout": asdict(self.layout), "num_tokens": self.num_tokens,
             "first_token_id": self.first_token_id}, separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def from_wire(cls, header: str, data: bytes) -> KVPayload:
        try:
            meta = json.loads(header)
            payload = cls(KVLayout(**meta["layout"]), int(meta["num_tokens"]),
                          int(meta["first_token_id"]), data)  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise KVTransferError(f"KV payload header unreadable: {exc}") from None
        return payload
