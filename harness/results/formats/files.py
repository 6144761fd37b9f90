"""Reading result files: JSON, JSON Lines or YAML by suffix, each also gzipped (`.gz`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from cbbench.harness.errors import CbbenchError


def _text(path: Path) -> tuple[str, str]:
    """(the text, the suffix that tells its format: `.json` of `x.json.gz`)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                return fh.read(), Path(path.stem).suffix
        return path.read_text(encoding="utf-8"), path.suffix
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise CbbenchError(f"{path}: cannot read ({exc})") from None


def parse(path: Path) -> Any:
    text, suffix = _text(path)
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CbbenchError(f"{path}: not valid YAML ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) <= 1 and suffix != ".jsonl":
            raise CbbenchError(f"{path}: not valid JSON ({exc.msg})") from None
    out = []  # JSON Lines: one object a line; a torn last line is dropped, as run folders do
    for i, ln in enumerate(lines, 1):
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError as e:
            if i == len(lines):
                break
            raise CbbenchError(f"{path}:{i}: not valid JSON ({e.msg})") from None
    return out


def beside(path: Path | None, name: str) -> Path | None:
    """The file `name` (or `name.gz`) in the folder of `path`, if there is one."""
    if path is None:
        return None
    for candidate in (path.with_name(name), path.with_name(name + ".gz")):
        if candidate.exists():
            return candidate
    return None
