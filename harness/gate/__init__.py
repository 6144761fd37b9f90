"""Regression gates: a policy of per-metric rules (`policy`, read from TOML) judged between a
baseline and a candidate run with bootstrap confidence intervals (`judge`).

Layer: gate (reads run folders, writes verdicts).
Imports: conclusions, results, report.
"""
