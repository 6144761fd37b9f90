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
