"""Issue 51, finding 15: a user's mistake is one line on stderr and exit 2, whatever the
command: an --out that cannot be a folder, a server that answers with a web page instead of
an API, pyarrow missing. Real commands, real servers on loopback. (CUDA asked of a CPU torch:
tests/test_run_cli.py::test_run_that_fails_to_start_leaves_no_folder.)"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers.fake import FakeServerConfig, threaded

CLI = [sys.executable, "-m", "cbbench.harness.cli"]


def one_line_error(capsys, argv: list[str]) -> str:
    """`cbbench ARGV` as the console script runs it (main): exit 2 and one error line."""
    from cbbench.harness.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    stderr = capsys.readouterr().err
    errors = [ln for ln in stderr.splitlines() if ": error: " in ln]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with threaded(FakeServerConfig()) as srv:
        yield srv.url


def test_out_that_cannot_be_a_folder(server: str, tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    bench = ["bench", "--base-url", server, "--num-requests", "2", "--no-live", "--out"]
    err = one_line_error(capsys, [*bench, "/proc/cbbench-test"])
    assert err.startswith("cbbench bench: error: /proc/cbbench-test: cannot write the run folder")
    err = one_line_error(capsys, [*bench, str(afile / "run")])
    assert "cannot write the run folder" in err and "Not a directory" in err
    err = one_line_error(capsys, [*bench, str(afile)])
    assert err.endswith("a file, not a folder: give --out a folder")
    assert afile.read_text() == "x"  # nothing written over it


class _WebPage(http.server.BaseHTTPRequestHandler):
    BODY = (
        b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body>\n<h1>Not Found"
        b"</h1>\n" + b"<p>The requested URL was not found on this server.</p>\n" * 40 + b"</body>"
    )

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(404)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def test_a_web_page_is_summarised_not_dumped(tmp_path: Path, capsys) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WebPage)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        err = one_line_error(capsys, ["bench", "--base-url", url, "--out", str(tmp_path / "r")])
    finally:
        srv.shutdown()
        t.join(10)
    assert err.endswith("HTTP 404: an HTML page ('404 Not Found'): not an OpenAI-compatible API")
    assert "<" not in err and len(err) < 200


def test_parquet_without_pyarrow_says_how_to_install_it(server: str, tmp_path: Path) -> None:
    """pyarrow is not a runtime dependency: without it (a package that fails to import stands
    in for its absence), `export --parquet` is one line telling how to install it."""
    from cbbench.harness.cli import main

    run = tmp_path / "run"
    assert main(["bench", "--base-url", server, "--num-requests", "3", "--no-live",
                 "--out", str(run)]) == 0  # fmt: skip
    shadow = tmp_path / "shadow" / "pyarrow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no pyarrow here')\n")
    import os

    env = {**os.environ, "PYTHONPATH": str(shadow.parent)}
    proc = subprocess.run([*CLI, "export", str(run), "--parquet", str(tmp_path / "r.parquet")],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "cbbench export: error: --parquet needs pyarrow, which cbbench does not install: "
        "pip install 'pyarrow>=14' (or write --csv)"
    )
    assert not (tmp_path / "r.parquet").exists()


def test_transformers_advice_is_a_range_the_project_accepts() -> None:
    """compare-engines' advice names the range pyproject's test extra allows (transformers
    5.25 needs Hugging Face's `kernels`, whose import name clashes with ours)."""
    import re

    from cbbench.harness.servers.peer_engines import transformers_install_hint

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    upper = re.search(r'"transformers>=[0-9.]+,<([0-9.]+)"', pyproject).group(1)
    hint = transformers_install_hint()
    assert hint == "pip install 'transformers>=5,<5.25'" and f"<{upper}" in hint
