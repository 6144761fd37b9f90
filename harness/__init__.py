"""cbbench.harness: the load-testing side, one subpackage per layer. Data flows

    workloads -> load (when to send what) -> client (HTTP, SSE) -> results (records, run
    folder, summary) -> report / gate / diagnose,

with telemetry sampled beside the load, servers the harness starts (the scripted test server,
the launcher, peer engines), sweeps of many runs, the Locust glue, studies that also drive the
reference engine, and cli on top. The harness talks to engines over HTTP only.
Each subpackage's docstring says what it may import; tests/test_import_graph.py holds it to that.

Layer: harness (root: errors only).
Imports: workloads.
"""
