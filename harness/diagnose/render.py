"""Diagnoses as terminal text, Markdown (PR comments, `cbbench report --markdown`) and HTML
(the report's "Diagnosis" section). The run's own engine is listed first among the fixes."""

from __future__ import annotations

from html import escape

from cbbench.harness.diagnose import Diagnosis
from cbbench.harness.diagnose.base import ENGINES, Finding
from cbbench.harness.diagnose.vitals import vitals_line


def engine_order(engine: str | None) -> list[str]:
    return ([engine] if engine in ENGINES else []) + [e for e in ENGINES if e != engine]


def _head(d: Diagnosis) -> str:
    bits = [f"{d.requests} requests"]
    if d.failed:  # the rules read the successful ones; say how many did not succeed
        bits = [f"{d.requests + d.failed} requests, {d.failed} failed"]
    if d.engine:
        bits.append(f"engine {d.engine}")
    if d.scheduler:
        bits.append(f"scheduler {d.scheduler}")
    return ", ".join(bits)


def text(diags: list[Diagnosis], all_engines: bool = False) -> str:
    lines: list[str] = []
    for d in diags:
        lines.append(f"== {d.label} ({_head(d)})")
        lines += [f"   {p} (the findings read only these)" for p in d.partial if d.requests]
        lines += [f"   {p}" for p in d.partial if not d.requests]
        lines.append(f"   vitals: {vitals_line(d.vitals)}")
        if not d.findings:
            lines.append("   no findings: " + ("no rule saw its symptom in this run" if d.requests
                         else "no successful per-request record to read"))  # fmt: skip
        for i, f in enumerate(d.findings, 1):
            lines.append(f"{i}. [{f.severity}] {f.title}  ({f.rule})")
            lines.append(f"   cause: {f.cause}")
            lines += [f"   - {e}" for e in f.evidence]
            engines = engine_order(d.engine)
            shown = engines if all_engines or not d.engine else engines[:1]
            for e in shown:
                lines.append(f"   fix ({e}): {f.fixes[e]}")
            if not all_engines and d.engine:
                lines.append("   (fixes for other engines: --all-engines)")
        lines.append("")
    return "\n".join(lines)


def _md(s: str) -> str:
    return escape(" ".join(str(s).split()), quote=False).replace("|", "\\|")


def markdown(diags: list[Diagnosis]) -> str:
    lines = ["#### Diagnosis", ""]
    for d in diags:
        if not d.findings:
            lines.append(
                f"- **{_md(d.label)}**: no findings ({_md(_head(d))}); {_md(vitals_line(d.vitals))}"
            )
            continue
        lines.append(f"- **{_md(d.label)}** ({_md(_head(d))}): {_md(vitals_line(d.vitals))}")
        for f in d.findings:
            lines.append(f"  - **{_md(f.title)}** (`{f.rule}`, {f.severity}): {_md(f.cause)}")
            lines += [f"    - {_md(e)}" for e in f.evidence]
            engine = engine_order(d.engine)[0]
            lines.append(f"    - fix ({engine}): {_md(f.fixes[engine])}")
    return "\n".join(lines) + "\n"


def _fix_html(text: str) -> str:
    """A fix, escaped, its `command` spans as <code> (the HTML showed the backticks)."""
    parts = escape(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: leave the text as it is
        return escape(text)
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _finding_html(f: Finding, engine: str | None) -> str:
    """The finding, its fix for the run's engine in a line, and the other engines' fixes in a
    collapsed table (five engines' fixes per finding pushed the charts screens down)."""
    ev = "".join(f"<li>{escape(e)}</li>" for e in f.evidence)
    first, *others = engine_order(engine)
    fixes = "".join(
        f"<tr><td class=name><b>{escape(e)}</b></td><td class=name>{_fix_html(f.fixes[e])}</td></tr>"
        for e in others
    )
    return (
        f'<div class="finding"><p><b>{escape(f.title)}</b> <code>{escape(f.rule)}</code> '
        f"<span class=muted>{escape(f.severity)}</span><br>{escape(f.cause)}</p>"
        f"<ul>{ev}</ul><p>fix ({escape(first)}): {_fix_html(f.fixes[first])}</p>"
        f"<details><summary>fixes for {len(others)} other engines</summary><table>"
        f"<tr><th class=name>engine</th><th class=name>fix</th></tr>{fixes}</table></details></div>"
    )


def html(diags: list[Diagnosis]) -> str:
    out = []
    for d in diags:
        body = (
            "".join(_finding_html(f, d.engine) for f in d.findings)
            or '<p class="muted">no findings: no rule saw its symptom in this run</p>'
        )
        out.append(
            f"<h3>{escape(d.label)} <span class=muted>({escape(_head(d))})</span></h3>"
            f"<p class=muted>vitals: {escape(vitals_line(d.vitals))}</p>{body}"
        )
    return '<div id="diagnosis">' + "".join(out) + "</div>"
