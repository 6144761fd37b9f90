"""Issue 51, finding 21: every command (and action) says what it does in its --help, and
`serve --help` lists every endpoint the server registers (it listed 5 of 11)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from cbbench.harness.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _parsers(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from _parsers(sub, f"{prefix}{name} ")


def test_every_command_has_a_description() -> None:
    missing = [name for name, p in _parsers(build_parser()) if not (p.description or "").strip()]
    assert not missing, missing


def test_serve_help_lists_every_endpoint() -> None:
    routes = set()
    for path in (ROOT / "reference_engine" / "server").glob("*.py"):
        routes |= set(re.findall(r'@app\.(?:get|post)\("([^"]+)"', path.read_text()))
    assert len(routes) >= 10, routes  # the reader found the routes
    serve = dict(_parsers(build_parser()))["serve"]
    missing = [r for r in sorted(routes) if r not in serve.description]
    assert not missing, missing
