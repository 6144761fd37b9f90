"""Results: the per-request record (`records`: the contract of `requests.jsonl`), the run
folder (`run_folder`: written as requests finish, read back by `load_run`), the summary
(`summary`, `session_summary`: records -> numbers, a pure function), whether the client's
timing can be trusted (`client_timing`), whether a run can be trusted (`outcome`), energy and
cost per token (`efficiency`), the comparison table (`compare`), where a run happened
(`environment`), secret redaction before anything is written (`redact`), and shard run
folders merged into one (`merge`).

Layer: results (below everything that reads or writes a run).
Imports: workloads (the statistics helpers).
"""
