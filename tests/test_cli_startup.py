"""`cbbench --help` and `cbbench CMD --help` are fast and quiet: only the command run is
imported, and no heavy dependency (torch, numpy, httpx, Locust/gevent, pandas, rich) is."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from cbbench.harness.cli import COMMAND_HELP, COMMAND_MODULES, build_parser, command_name

HEAVY = ("torch", "numpy", "httpx", "locust", "gevent", "pandas", "rich", "fastapi", "triton")


def test_static_help_is_each_modules_own():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    registered = {c.dest: c.help for c in action._choices_actions}
    assert set(registered) == {command_name(m) for m in COMMAND_MODULES}
    fix = "keep harness/cli/__init__.py COMMAND_HELP equal to each command's help="
    assert registered == COMMAND_HELP, fix


def _imports_after(argv: list[str]) -> tuple[list[str], str]:
    code = (
        "import sys, json\n"
        "from cbbench.harness.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize(
    "argv", [["--help"], ["sim", "--help"], ["serve", "--help"], ["bench", "--help"]]
)
def test_help_imports_nothing_heavy_and_warns_nothing(argv):
    heavy, stderr = _imports_after(argv)
    assert heavy == [], f"cbbench {' '.join(argv)} imported {heavy}"
    assert "Warning" not in stderr


def test_top_level_help_lists_every_command(capsys):
    from cbbench.harness.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in COMMAND_HELP:
        assert name in out
