"""A finished `cbbench serve` process ends fast and still cleanly: `exit_now` keeps what an
exit must do (non-daemon threads finish, atexit handlers run, buffered stdout is written, the
exit code is kept); a simulated-executor engine builds without importing torch at all, and
building a model never imports torch._dynamo (~1.2 s and ~1.3 s of a server's start). One
child interpreter checks all three."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import atexit, sys, threading, time
from pathlib import Path
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.engine_core import EngineCore
from cbbench.reference_engine.server.quick_exit import exit_now

EngineCore(EngineConfig(executor="sim", max_model_len=128))  # what `serve --executor sim` runs
assert "torch" not in sys.modules, "the simulated executor's engine imported torch"
from cbbench.reference_engine.model.loader import random_model

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


def test_exit_now_keeps_what_an_exit_must_and_engines_import_only_what_they_use(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 3, p.stderr
    assert p.stdout == "buffered, never flushed by hand"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "done"
    assert "Traceback" not in p.stderr and "leaked" not in p.stderr, p.stderr
