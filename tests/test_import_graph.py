"""The allowed import directions between cbbench's layers, read from the source (AST).

Between the four top-level packages:

    workloads, kernels   <- nothing of cbbench but themselves
    reference_engine     <- kernels, workloads (the engine stands alone: no harness)
    harness (library)    <- workloads (talks to engines over HTTP only)
    harness/studies      <- everything but the commands
    harness/cli          <- anything; nothing imports a command module

Inside harness/ and reference_engine/, each subpackage may import only the subpackages that
ALLOWED lists for it (and its package's root modules, e.g. `errors`); its `__init__`
docstring says the same in an `Imports:` line, checked here. Function-local imports count:
a lazy import is still a dependency. No cycles between modules either.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("harness", "reference_engine", "kernels", "workloads")
ANY = "anything"
ANY_BUT_CLI = "anything but cli"

# package -> what it may import besides itself (a prefix: "x" allows x and x.*). The root
# modules of harness/ and reference_engine/ (errors, sampling_params) are open to their own
# subpackages.
ALLOWED: dict[str, set[str] | str] = {
    "workloads": set(),
    "kernels": set(),
    # the engine, bottom up
    "reference_engine.config": set(),
    "reference_engine.core": set(),
    "reference_engine.kv_transfer": set(),
    "reference_engine.model": {"kernels"},
    "reference_engine.execution": {
        "reference_engine.core",
        "reference_engine.kv_transfer",
        "reference_engine.model",
        "kernels",
    },
    "reference_engine.scheduler": {"reference_engine.config", "reference_engine.core"},
    "reference_engine.spec_decode": {
        "reference_engine.config",
        "reference_engine.core",
        "reference_engine.execution",
        "reference_engine.model",
    },
    "reference_engine.engine": {
        "reference_engine.config",
        "reference_engine.core",
        "reference_engine.kv_transfer",
        "reference_engine.execution",
        "reference_engine.model",
        "reference_engine.scheduler",
        "reference_engine.spec_decode",
    },
    "reference_engine.sim": {
        "reference_engine.config",
        "reference_engine.core",
        "reference_engine.engine",
        "reference_engine.execution",
        "reference_engine.model",
        "workloads",
    },
    "reference_engine.server": {
        "reference_engine.config",
        "reference_engine.core",
        "reference_engine.kv_transfer",
        "reference_engine.engine",
        "reference_engine.model",
    },
    "reference_engine.router": {
        "reference_engine.config",
        "reference_engine.core",
        "reference_engine.kv_transfer",
        "reference_engine.engine",
        "reference_engine.execution",
        "reference_engine.model",
        "reference_engine.server",
        "reference_engine.sim",
        "workloads",
    },
    "reference_engine": {"kernels", "workloads"},
    # the harness: workload -> load -> client -> results -> report / gate
    "harness.results": {"workloads"},
    "harness.telemetry": set(),
    "harness.client": {"harness.results"},
    "harness.console": {"harness.results"},
    "harness.diagnose": {"harness.results"},
    "harness.report": {"harness.diagnose", "harness.results"},
    "harness.gate": {"harness.report", "harness.results"},
    "harness.servers": {
        "harness.client",
        "reference_engine.server.lifeline",  # stdlib-only: launched children die with it
    },
    "harness.load": {
        "harness.client",
        "harness.console",
        "harness.results",
        "harness.telemetry",
        "workloads",
        "reference_engine.server.lifeline",  # stdlib-only: children die with their parent
    },
    "harness.sweep": {"harness.load", "harness.results", "harness.telemetry"},
    "harness.probe": {
        "harness.client",
        "harness.load",
        "harness.results",
        "harness.telemetry",
        "workloads",
    },
    "harness.locust": {
        "harness.client",
        "harness.load",
        "harness.results",
        "harness.telemetry",
        "workloads",
    },
    "harness.studies": ANY_BUT_CLI,
    "harness.cli": ANY,
    "harness": {"workloads"},
}
# Stdlib-only modules other layers may borrow: they must import nothing of cbbench.
SHARED = {"reference_engine.server.lifeline"}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def package_of(module: str) -> str:
    """The ALLOWED key that owns `module` ("reference_engine.core.sequence" -> "...core")."""
    name = module.removeprefix("cbbench.")
    return max((k for k in ALLOWED if under(name, k)), key=len)


def may_import(src: str, dst: str) -> bool:
    pkg, target = package_of(src), dst.removeprefix("cbbench.")
    rule = ALLOWED[pkg]
    if under(target, pkg):
        return True
    top = pkg.split(".")[0]
    if "." in pkg and package_of(dst) == top:  # the root modules of its own top package
        return True
    if rule == ANY:
        return True
    if rule == ANY_BUT_CLI:
        return not under(target, "harness.cli")
    return any(under(target, a) for a in rule)


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for top in TOPS:
        for path in (root / top).rglob("*.py"):
            rel = path.relative_to(root / top).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join(["cbbench", top, *parts])] = path
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


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def violations(g: dict[str, set[str]]) -> list[str]:
    return [
        f"{m} ({package_of(m)}) imports {d} ({package_of(d)})"
        for m, deps in sorted(g.items())
        for d in sorted(deps)
        if not may_import(m, d)
    ]


def test_layers_import_only_downwards():
    bad = violations(graph())
    assert not bad, "\n".join(bad)


def test_the_checker_fails_on_an_upward_import(tmp_path):
    """A tree like ours with one engine module importing the harness, one harness client
    module importing the load layer above it: both are reported, the allowed arrow is not."""
    files = {
        "reference_engine/__init__.py": "",
        "reference_engine/core/__init__.py": "",
        "reference_engine/core/sequence.py": "import cbbench.harness.load.runner\n",
        "harness/__init__.py": "",
        "harness/load/__init__.py": "",
        "harness/load/runner.py": "from cbbench.harness.client.api import OpenAIClient\n",
        "harness/client/__init__.py": "",
        "harness/client/api.py": "def f():\n    from cbbench.harness.load.runner import x\n",
        "kernels/__init__.py": "",
        "workloads/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    bad = violations(graph(tmp_path))
    assert bad == [
        "cbbench.harness.client.api (harness.client) imports cbbench.harness.load.runner "
        "(harness.load)",
        "cbbench.reference_engine.core.sequence (reference_engine.core) imports "
        "cbbench.harness.load.runner (harness.load)",
    ]


def test_shared_helpers_import_nothing_of_cbbench():
    g = graph()
    for m in SHARED:
        assert not g[f"cbbench.{m}"], f"{m} must stay stdlib-only to be shared: {g[m]}"


def test_nothing_imports_a_command_module():
    bad = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        if package_of(m) != "harness.cli"
        for d in deps
        if package_of(d) == "harness.cli"
    ]
    assert not bad, "\n".join(bad)


def _packages(root: Path = ROOT) -> dict[str, Path]:
    return {
        ".".join(["cbbench", top, *p.parent.relative_to(root / top).parts]): p
        for top in TOPS
        for p in sorted((root / top).rglob("__init__.py"))
    }


def test_every_package_docstring_names_its_layer_and_imports():
    """`Layer:` in every package; `Imports:` in each ALLOWED one, equal to ALLOWED."""
    for pkg, init in _packages().items():
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert re.search(r"^Layer: \S", doc, re.M), f"{init}: no 'Layer:' line"
        key = pkg.removeprefix("cbbench.")
        if key not in ALLOWED:
            continue
        m = re.search(r"^Imports: (.+)$", doc, re.M)
        assert m, f"{init}: no 'Imports:' line"
        said = re.sub(r"\([^)]*\)", "", m.group(1)).strip().rstrip(".")
        rule = ALLOWED[key]
        if isinstance(rule, str):
            assert said.startswith(rule), f"{init}: says {said!r}, ALLOWED has {rule!r}"
            continue
        top = key.split(".")[0]
        names = set() if said.startswith("nothing") else {n.strip() for n in said.split(",")}
        names = {n if n.split(".")[0] in TOPS else f"{top}.{n}" for n in names}
        assert names == rule, f"{init}: says {sorted(names)}, ALLOWED has {sorted(rule)}"


def test_every_package_is_installed():
    """pyproject lists packages one by one: a new folder missing there ships nowhere."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert set(_packages()) <= listed, sorted(set(_packages()) - listed)


def test_few_modules_at_the_roots():
    for top in ("harness", "reference_engine"):
        loose = sorted(p.name for p in (ROOT / top).glob("*.py"))
        assert len(loose) <= 8, f"{top}/ has {len(loose)} modules at its root: {loose}"


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


def test_no_cycles_between_packages():
    """The ALLOWED arrows form a DAG: no two packages may import each other."""
    g = {k: set() if isinstance(v, str) else set(v) for k, v in ALLOWED.items()}
    g = {k: {package_of("cbbench." + d) for d in v} - {k} for k, v in g.items()}
    assert not _cycles(g)


@pytest.mark.parametrize("module", ["cbbench.harness.cli.sim", "cbbench.harness.cli.serve"])
def test_the_checker_sees_imports(module):
    """The AST reader finds what a command imports (so an empty result above means something)."""
    g = graph()
    assert "cbbench.reference_engine.config.options" in g[module]


def test_long_modules_say_why():
    """A module over 400 lines says why in its docstring ("Over 400 lines because ...")."""
    for top in TOPS:
        for path in (ROOT / top).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if text.count("\n") <= 400:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            assert "Over 400 lines because" in doc, f"{path}: {text.count(chr(10))} lines"


def test_no_distribution_takes_the_name_kernels():
    """Hugging Face's `kernels` (required by transformers >= 5.25) imports as `kernels`, which
    from the repository root is this repo's kernels/ folder: transformers would import ours."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        return
    pytest.fail(
        f"the distribution 'kernels' {dist.version} is installed (pulled in by "
        "transformers >= 5.25?): its import name collides with ./kernels; keep transformers < 5.25"
    )
