"""Every `cbbench ...` command in the docs' code blocks names flags the command has, in their
current spelling: a user copies these lines. (speculative-decoding.md and engine.md showed
`sim --scheduler`, which prints an old-spelling note.)"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from cbbench.harness.cli import build_parser
from cbbench.harness.cli.parsing import OLD_SPELLINGS

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _commands(text: str) -> list[list[str]]:
    """The `cbbench` commands of a page's fenced blocks, continuation lines joined."""
    out = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line.startswith("cbbench "):
                continue
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            out.append(words[1:])
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parser_for(root: argparse.ArgumentParser, words: list[str]):
    parser, rest = root, words
    while rest and rest[0] in _subparsers(parser):
        parser, rest = _subparsers(parser)[rest[0]], rest[1:]
    return parser, rest


def test_doc_commands_use_existing_flags_in_their_current_spelling():
    root = build_parser()
    problems = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for words in _commands(page.read_text()):
            parser, rest = _parser_for(root, words)
            if parser is root:
                continue
            olds = OLD_SPELLINGS.get(parser.prog, {})
            for w in rest:
                if w == "--":
                    break  # passed through (locust)
                if not w.lstrip("[").startswith("--"):
                    continue
                flag = w.strip("[]").split("=", 1)[0]
                if flag not in parser._option_string_actions:
                    problems.append(f"{page.name}: {parser.prog} has no {flag}")
                elif flag in olds:
                    problems.append(f"{page.name}: {parser.prog} {flag} is old; {olds[flag]}")
    assert not problems, "\n".join(problems)
