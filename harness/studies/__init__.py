"""Studies: orchestrations that use both the harness and the reference engine.

The one layer allowed to import both (see docs/architecture.md and tests/test_import_graph.py):
`simulation` (`cbbench sim`, `run --sim`), `run_demo` (`cbbench run`). Commands in
harness/cli/ parse flags into their typed options and call one function here.

Layer: studies (harness and reference engine together).
Imports: anything but cli.
"""
