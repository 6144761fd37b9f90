"""Run-level conclusions over run folders, shared by bench, sweep, report and gate, one rule
each: the steady-state window (`window`), repeated runs with intervals (`repeats`),
over-saturation (`saturation`) and the MLPerf-style server verdict (`mlperf`).

Layer: conclusions (records and summaries -> verdicts; no I/O beyond run folders).
Imports: results, workloads.
"""
