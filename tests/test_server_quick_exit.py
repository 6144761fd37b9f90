"""A finished `cbbench serve` process ends fast and still cleanly: `exit_now` keeps what an
exit must do (non-daemon threads finish, atexit handlers run, buffered stdout is written, the
exit code is kept), and building an engine's model never imports torch._dynamo (its import
was ~1.3 s of every server start). One child interpreter checks both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import atexit, sys, threading, time
from pathlib import Path
from cbbench.reference_engine.model.loader import random_model
from cbbench.reference_engine.server.quick_exit import exit_now

random_model("tiny-moe")  # every init a model runs (Linear, Embedding, experts) on meta
assert "torch._dynamo" not in sys.modules, "building the model imported torch._dynamo"
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))

def late():
    time.sleep(0.3)
    (out / "thread").write_text("done")

threading.Thread(target=late).start()  # not a daemon: the exit waits for it
sys.stdout.write("buffered, never flushed by hand")
exit_now(3)
"""


def test_exit_now_keeps_what_an_exit_must_and_no_dynamo_import(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 3, p.stderr
    assert p.stdout == "buffered, never flushed by hand"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "done"
    assert "Traceback" not in p.stderr and "leaked" not in p.stderr, p.stderr
