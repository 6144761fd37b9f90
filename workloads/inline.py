"""Fixed lengths written inline: `--workload prompt=128,output=128` (what vLLM users give as
`--random-input-len 128 --random-output-len 128`): a synthetic spec with constant lengths."""

from __future__ import annotations

import re

from cbbench.workloads.errors import WorkloadError

INLINE_KEYS = ("prompt", "output")
_PART = re.compile(r"\s*([a-z_]+)\s*=\s*(\S*)\s*")


def is_inline(text: str) -> bool:
    """True for `key=value[,key=value]` text (never a file name a user would write)."""
    return "=" in text and "/" not in text and not text.endswith((".toml", ".json", ".jsonl"))


def parse_inline(text: str) -> dict:
    """'prompt=128,output=64' -> a spec table {"prompt": 128, "output": 64, "name": ...}."""
    out: dict = {}
    for part in text.split(","):
        m = _PART.fullmatch(part)
        key = m.group(1) if m else part.strip()
        if not m or key not in INLINE_KEYS:
            raise WorkloadError(
                f"--workload {text}: {part.strip()!r}: expected prompt=TOKENS,output=TOKENS"
            )
        value = m.group(2)
        if not value.isdigit() or int(value) < 1:
            raise WorkloadError(
                f"--workload {text}: {key}={value}: a token count must be an integer >= 1"
            )
        out[key] = int(value)
    missing = [k for k in INLINE_KEYS if k not in out]
    if missing:
        raise WorkloadError(f"--workload {text}: give {missing[0]}=TOKENS too")
    out["name"] = f"fixed-{out['prompt']}-{out['output']}"
    return out
