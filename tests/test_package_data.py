"""Every file a compiled path needs at run time ships in the wheel: the kernels and the client
build their C/C++ sources on first use, so a source or header that package-data misses works
in an editable install and fails (falling back, slower) in a plain `pip install`."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_package_data_covers_every_compiled_source_and_header():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    checked = 0
    for package, folder in (
        ("cbbench.kernels", "kernels"),
        ("cbbench.harness.client", "harness/client"),
    ):
        globs = data[package]
        for f in sorted((ROOT / folder / "csrc").iterdir()):
            rel = f"csrc/{f.name}"
            assert any(fnmatch.fnmatch(rel, g) for g in globs), (
                f"{folder}/{rel} is not in {package}'s package-data {globs}"
            )
            checked += 1
    assert checked >= 10
