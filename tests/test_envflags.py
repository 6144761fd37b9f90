"""The CBBENCH_* on/off switches: `=0` (or empty/false/no/off) means "not set", as users expect."""

from __future__ import annotations

import pytest
from cbbench.harness.client import aio, cread
from cbbench.harness.envflags import env_flag


@pytest.mark.parametrize("value", ["", "0", "false", "No", " off "])
def test_false_words_leave_the_switch_unset(monkeypatch, value):
    monkeypatch.setenv("CBBENCH_NO_CREAD", value)
    assert not env_flag("CBBENCH_NO_CREAD")


@pytest.mark.parametrize("value", ["1", "true", "yes", "ON"])
def test_true_words_set_the_switch(monkeypatch, value):
    monkeypatch.setenv("CBBENCH_NO_CREAD", value)
    assert env_flag("CBBENCH_NO_CREAD")


def test_no_cread_0_keeps_the_compiled_read_path_allowed(monkeypatch):
    monkeypatch.setenv("CBBENCH_NO_CREAD", "0")
    cread.load()
    assert cread.reason() != "off (CBBENCH_NO_CREAD)"
    monkeypatch.setenv("CBBENCH_NO_CREAD", "1")
    assert cread.load() is None and cread.reason() == "off (CBBENCH_NO_CREAD)"


def test_no_uvloop_0_keeps_uvloop(monkeypatch):
    pytest.importorskip("uvloop")
    monkeypatch.setenv("CBBENCH_NO_UVLOOP", "0")
    assert aio.loop_name() == "uvloop"
    monkeypatch.setenv("CBBENCH_NO_UVLOOP", "1")
    assert aio.loop_name() == "asyncio"


@pytest.mark.parametrize("module, name", [("test_router_bench", "CBBENCH_ROUTER_SIM_BIG"),
                                          ("test_event_skip_bench", "CBBENCH_SKIP_BIG")])  # fmt: skip
def test_benchmark_big_switches_read_0_as_off(monkeypatch, module, name):
    """The benchmarks' developer switches: `=0` leaves out the 1,000-replica row, `=1` adds it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "benchmarks" / f"{module}.py"

    def scales(value: str) -> list:
        monkeypatch.setenv(name, value)
        spec = importlib.util.spec_from_file_location(f"_envflag_{module}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.SCALES

    assert (1_000, 100_000) not in scales("0")
    assert (1_000, 100_000) in scales("1")
