"""`cbbench version`: versions of cbbench and the libraries that shape its numbers."""

from __future__ import annotations

import argparse
import platform
from importlib import metadata


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("version", help="print cbbench's version and its key dependencies")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(f"cbbench {package_version('cbbench')}")
    print(f"python {platform.python_version()} ({platform.platform()})")
    for dep in ("torch", "httpx", "numpy", "pandas", "locust", "triton"):
        print(f"{dep} {package_version(dep) or 'not installed'}")
    return 0
