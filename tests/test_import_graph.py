"""The allowed import directions between cbbench's layers, read from the source (AST).

    workloads            <- nothing of cbbench but itself
    kernels              <- nothing of cbbench but itself (no engine imports)
    reference_engine     <- kernels, workloads
    harness (library)    <- workloads (talks to engines over HTTP only)
    harness/studies      <- harness library, reference_engine, workloads, kernels
    harness/cli          <- anything; nothing imports a command module
Function-local imports count too: a lazy import is still a dependency. No cycles between
modules either (a package's __init__ re-exporting its own submodules aside).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "cbbench.harness": ROOT / "harness",
    "cbbench.reference_engine": ROOT / "reference_engine",
    "cbbench.kernels": ROOT / "kernels",
    "cbbench.workloads": ROOT / "workloads",
}
# layer -> the layers it may import
ALLOWED = {
    "workloads": {"workloads"},
    "kernels": {"kernels"},
    "reference_engine": {"reference_engine", "kernels", "workloads"},
    "harness": {"harness", "workloads"},
    "studies": {"studies", "harness", "reference_engine", "kernels", "workloads"},
    "cli": {"cli", "studies", "harness", "reference_engine", "kernels", "workloads"},
}


# Stdlib-only process helpers any layer may use (listed one by one; keep this short).
SHARED = {
    "cbbench.harness.lifeline",  # children die with their parent: workers and serve's helpers
}


def layer(module: str) -> str:
    for sub in ("cli", "studies"):
        pkg = f"cbbench.harness.{sub}"
        if module == pkg or module.startswith(pkg + "."):
            return sub
    return module.split(".")[1]


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The cbbench modules `module` imports (anywhere in the file)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if not name.startswith("cbbench."):
                continue
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def test_layers_import_only_downwards():
    bad = [
        f"{m} ({layer(m)}) imports {d} ({layer(d)})"
        for m, deps in graph().items()
        for d in sorted(deps)
        if layer(d) not in ALLOWED[layer(m)] and d not in SHARED
    ]
    assert not bad, "\n".join(bad)


def test_shared_helpers_import_nothing_of_cbbench():
    g = graph()
    for m in SHARED:
        assert not g[m], f"{m} must stay stdlib-only to be shared by every layer: {g[m]}"


def test_nothing_imports_a_command_module():
    bad = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        if layer(m) != "cli"
        for d in deps
        if layer(d) == "cli"
    ]
    assert not bad, "\n".join(bad)


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    g = graph()
    # a package's __init__ importing its own submodules is how it re-exports them: drop those
    # edges (parent -> child) so only real cycles remain
    pruned = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in g.items()}
    cycles = _cycles(pruned)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", ["cbbench.harness.cli.sim", "cbbench.harness.cli.serve"])
def test_the_checker_sees_imports(module):
    """The AST reader finds what a command imports (so an empty result above means something)."""
    g = graph()
    assert "cbbench.reference_engine.options" in g[module]
