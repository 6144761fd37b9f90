"""`cbbench gate --baseline RUN --candidate RUN`: exit 0 pass, 1 regression, 2 unusable input."""

from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from cbbench.harness.cli.parsing import old_spelling
from cbbench.harness.errors import CbbenchError
from cbbench.harness.gate.policy import LATENCY, THROUGHPUT
from cbbench.harness.gate.verdict import TOO_FEW
from cbbench.harness.load.rigor_options import add_window_arg

VERDICT_STYLE = {
    "pass": "green",
    "noisy": "yellow",
    "cannot tell": "yellow",
    "fail": "bold red",
    "n/a": "dim",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gate",
        help="fail CI on a statistically clear regression between two runs",
        description="Judge every policy rule with a seeded bootstrap confidence interval over "
        "the per-request records; a rule fails only when the whole interval is beyond its "
        "limit. Runs that are not comparable (another endpoint, streaming mode, load shape, "
        "workload or model) are refused. Exit 0 pass, 1 regression, 2 unusable or "
        "incomparable input.",
    )
    p.add_argument("--baseline", required=True, metavar="RUN", help="baseline run folder")
    p.add_argument("--candidate", required=True, metavar="RUN", help="candidate run folder")
    p.add_argument("--policy-file", dest="policy", metavar="TOML",
                   help="rules file (default: the built-in policy; --policy: old spelling)")  # fmt: skip
    old_spelling(p, "--policy", "--policy-file")  # --policy is the queue policy in serve/run/sim
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML (one test per rule)")
    p.add_argument("--markdown", metavar="FILE", help="also write a Markdown table")
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="judge runs that were killed or interrupted (default: refuse them, exit 2)",
    )
    p.add_argument(
        "--allow-incomparable",
        action="store_true",
        help="judge runs that differ in endpoint, streaming, load shape (open/closed loop, "
        "rate, concurrency), workload or model (default: refuse them, exit 2, naming the "
        "differences)",
    )
    p.add_argument(
        "--fail-on-cannot-tell",
        action="store_true",
        help="exit 3 when no rule failed but one could not be told (CANNOT TELL: the runs "
        "are too small or too noisy); default exit 0, as nothing was shown to regress",
    )
    add_window_arg(p, default=None)  # the same kind on both sides (docs/rigor.md)
    p.set_defaults(func=run)


def print_differences(gate) -> None:
    """Before the table: a judged pair that is not comparable (--allow-incomparable) says so on
    stderr, one line; what to read with care (request count, the server's batching or thread
    settings) and what is compared (the server, its scheduler) one line each on stdout."""
    from cbbench.harness.results.comparability import CAUTION, INCOMPARABLE, INFO, summary_line

    bad = [d for d in gate.differences if d.severity == INCOMPARABLE]
    care = [d for d in gate.differences if d.severity == CAUTION]
    rest = [d for d in gate.differences if d.severity == INFO]
    if care:
        print("read with care: runs differ in " + summary_line(care))
    if bad:
        print(
            "cbbench gate: warning: not comparable, judged anyway (--allow-incomparable): "
            + summary_line(bad),
            file=sys.stderr,
        )
    if rest:
        print("runs differ in " + summary_line(rest))


def fmt_value(metric: str, v: float | None) -> str:
    if v is None or v != v:
        return "–"
    if metric in LATENCY:
        return f"{v * 1e3:.1f} ms"
    if metric in THROUGHPUT:
        return f"{v:.2f}/s"
    return f"{v:.2%}"


def fmt_change(r) -> tuple[str, str]:
    """(estimate, interval) as shown: a % change for relative rules, a value otherwise."""
    if r.verdict == "n/a":
        return "–", "–"
    if r.rule.relative:
        return f"{r.estimate - 1:+.1%}", f"[{r.low - 1:+.1%}, {r.high - 1:+.1%}]"
    m = r.rule.metric
    return fmt_value(m, r.estimate), f"[{fmt_value(m, r.low)}, {fmt_value(m, r.high)}]"


def fmt_limit(r) -> str:
    if r.rule.limit == "max_increase":
        return f"<= +{r.rule.value:.0%}"
    if r.rule.limit == "max_decrease":
        return f">= -{r.rule.value:.0%}"
    op = "<=" if r.rule.limit == "max" else ">="
    return f"{op} {fmt_value(r.rule.metric, r.rule.value)}"


def print_table(gate) -> None:
    from rich.console import Console
    from rich.table import Table

    conf = f"{gate.policy.confidence:.0%}"
    t = Table(title=f"cbbench gate ({_method(gate)})")
    for col in ("rule", "baseline", "candidate", "change", f"{conf} CI", "limit", "verdict"):
        t.add_column(
            col, justify="left" if col in ("rule", "verdict") else "right", no_wrap=col != "verdict"
        )
    for r in gate.results:
        est, ci = fmt_change(r)
        style = VERDICT_STYLE[r.verdict]
        t.add_row(
            r.rule.title,
            fmt_value(r.rule.metric, r.baseline),
            fmt_value(r.rule.metric, r.candidate),
            est,
            ci,
            fmt_limit(r),
            f"[{style}]{r.verdict}[/]" + (f" ({r.note})" if r.note else ""),
        )
    console = Console(highlight=False, soft_wrap=True)
    if console.is_terminal:
        console.print(t, markup=True)
        if gate.note:  # once, under the table (the Markdown below carries it too)
            console.print(gate.note, markup=False, highlight=False)
    else:  # a CI log or a file: Markdown, one line a rule, never wrapped mid-phrase
        print(markdown(gate, escape_html=False), end="")
    for note in gate.notes:  # which windows were compared (harness/conclusions/window.py)
        console.print(note, markup=False, soft_wrap=True)
    failed = [r for r in gate.results if r.failed]
    unsure = [r for r in gate.results if r.verdict == "cannot tell"]
    skipped = sum(r.verdict == "n/a" for r in gate.results)
    judged = len(gate.results) - skipped
    tail = f", {skipped} not applicable" if skipped else ""
    console.print(
        f"[bold red]REGRESSION: {len(failed)} of {judged} rules failed{tail}[/]"
        if failed
        else f"[yellow]CANNOT TELL (inconclusive): {len(unsure)} of {judged} rules; the runs "
        "are too small for them to fail (more requests, or --repeats, narrow the intervals); "
        "not a pass[/]"
        if unsure and all(TOO_FEW in r.note for r in unsure)
        else f"[yellow]CANNOT TELL: {len(unsure)} of {judged} rules; the two configurations "
        "are not distinguishable at this confidence (more --repeats narrow the intervals)[/]"
        if unsure
        else f"[green]PASS: {judged} rules{tail}[/]",
        soft_wrap=True,
    )


def _method(gate) -> str:
    """How the intervals were made: a bootstrap over one run's requests, or (repeats
    folders) Welch's t-interval over the run means."""
    conf = f"{gate.policy.confidence:.0%}"
    if gate.method == "bootstrap CI":
        return f"{gate.policy.source}, {conf} bootstrap CI, {gate.policy.resamples} resamples"
    return f"{gate.policy.source}, {conf} {gate.method}"


def markdown(gate, escape_html: bool = True, notes: bool = False) -> str:
    """The table as Markdown: for a PR comment (`<`, `>` escaped) or a log (as typed);
    `notes`: with what the terminal prints around it (what to read with care, the windows)."""

    def cell(text: str) -> str:
        text = text.replace("|", "\\|")
        return text.replace("<", "&lt;").replace(">", "&gt;") if escape_html else text

    conf = f"{gate.policy.confidence:.0%}"
    unsure = any(r.verdict == "cannot tell" for r in gate.results)
    head = "REGRESSION" if not gate.passed else "CANNOT TELL" if unsure else "PASS"
    lines = [
        f"### cbbench gate: {head}",
        "",
        _method(gate),
        "",
        f"| rule | baseline | candidate | change | {conf} CI | limit | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in gate.results:
        est, ci = fmt_change(r)
        verdict = (f"**{r.verdict}**" if r.failed else r.verdict) + (
            f" ({r.note})" if r.note else ""
        )
        row = [
            r.rule.title,
            fmt_value(r.rule.metric, r.baseline),
            fmt_value(r.rule.metric, r.candidate),
            est,
            ci,
            fmt_limit(r),
            verdict,
        ]
        lines.append("| " + " | ".join(cell(x) for x in row) + " |")
    lines += ["", "A rule fails only when its whole interval lies beyond the limit."]
    if unsure:
        lines.append(
            "'cannot tell': the interval straddles the limit, or is too wide for the rule to "
            "fail (inconclusive: too few requests); more requests or repeats narrow it."
        )
    if gate.note:
        lines += ["", cell(gate.note)]
    if notes:
        from cbbench.harness.results.comparability import CAUTION, summary_line

        care = [d for d in gate.differences if d.severity == CAUTION]
        said = [f"read with care: runs differ in {summary_line(care)}"] if care else []
        lines += ["", *(f"- {cell(x)}" for x in said + list(gate.notes))]
    return "\n".join(lines) + "\n"


def junit(gate) -> str:
    failed = sum(r.failed for r in gate.results)
    suite = ET.Element(
        "testsuite",
        name="cbbench.gate",
        tests=str(len(gate.results)),
        failures=str(failed),
        errors="0",
        skipped=str(sum(r.verdict == "n/a" for r in gate.results)),
    )
    for r in gate.results:
        case = ET.SubElement(suite, "testcase", classname="cbbench.gate", name=r.rule.title)
        est, ci = fmt_change(r)
        detail = (
            f"baseline {fmt_value(r.rule.metric, r.baseline)}, candidate "
            f"{fmt_value(r.rule.metric, r.candidate)}, change {est} CI {ci}, "
            f"limit {fmt_limit(r)}"
        )
        if r.failed:
            ET.SubElement(case, "failure", message=f"{r.rule.title}: {detail}").text = detail
        elif r.verdict == "n/a":
            ET.SubElement(case, "skipped", message=r.note)
        else:
            ET.SubElement(case, "system-out").text = f"{r.verdict}: {detail}"
    return ET.tostring(ET.ElementTree(suite).getroot(), encoding="unicode", xml_declaration=True)


def _write(path: str, text: str) -> None:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(text + ("" if text.endswith("\n") else "\n"), encoding="utf-8")
        os.replace(tmp, p)
    except OSError as exc:
        raise CbbenchError(f"{p}: cannot write ({exc.strerror})") from None


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.gate.judge import run_gate
    from cbbench.harness.gate.policy import DEFAULT_POLICY, load_policy
    from cbbench.harness.gate.repeated import is_repeats, run_repeated_gate
    from cbbench.harness.results.integrity import trust_problems
    from cbbench.harness.results.run_folder import load_run

    policy = load_policy(args.policy) if args.policy else DEFAULT_POLICY
    if is_repeats(args.baseline) != is_repeats(args.candidate):
        raise CbbenchError("compare a --repeats folder with a --repeats folder, a run with a run")
    if is_repeats(args.baseline):  # judged on the run means (harness/gate/repeated.py)
        if args.window is not None:
            raise CbbenchError(
                "--window: repeats folders are judged on the figures each run led with "
                "(set it on `bench --repeats`)"
            )
        gate = run_repeated_gate(
            args.baseline, args.candidate, policy, args.allow_incomplete, args.allow_incomparable
        )
        print_differences(gate)
    else:
        base, cand = load_run(args.baseline), load_run(args.candidate)
        if args.allow_incomplete:  # judged anyway: say on what
            for which, r in (("baseline", base), ("candidate", cand)):
                for problem in trust_problems(r):
                    print(f"cbbench gate: warning: the {which} is {problem}", file=sys.stderr)
        gate = run_gate(
            base, cand, policy, args.allow_incomplete, args.allow_incomparable, window=args.window
        )
        print_differences(gate)
    print_table(gate)
    if args.junit:
        _write(args.junit, junit(gate))
    if args.markdown:
        _write(args.markdown, markdown(gate, notes=True))
    if not gate.passed:
        return 1
    return 3 if args.fail_on_cannot_tell and gate.undecided else 0
