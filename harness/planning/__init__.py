"""Planning: the backends of `cbbench plan` and `cbbench calibrate --from-run`.

`planner` (the search: bisection on replicas, pruning, intervals), `space` (the configuration
space and its `--space` grammar), `pd` (prefill/decode pools in a plan), `report` (frontier,
serve and vLLM flags, plan.html) and `calibration` (fitting the simulator to any server's
bench runs). Like studies they run the simulator on workloads, so they may import both the
harness library and the reference engine.

Layer: planning (harness and reference engine together, as studies).
Imports: anything but cli.
"""
