import subprocess
import sys

from cbbench.harness.cli import main


def test_help_lists_subcommands(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "version" in out


def test_version_runs_as_console_script():
    out = subprocess.run(
        [sys.executable, "-m", "cbbench.harness.cli", "version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("cbbench ")


def test_bad_flag_is_one_line_and_nonzero():
    proc = subprocess.run(
        [sys.executable, "-m", "cbbench.harness.cli", "--no-such-flag"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_every_commands_help_renders():
    # argparse %-formats each help string: a bare "%" in one ("a few % between") made
    # `cbbench calibrate --help` a traceback
    import argparse

    from cbbench.harness.cli import build_parser

    def parsers(p: argparse.ArgumentParser):
        yield p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sp in a.choices.values():
                    yield from parsers(sp)

    seen = 0
    for p in parsers(build_parser()):
        assert p.format_help(), p.prog
        seen += 1
    assert seen > 20
