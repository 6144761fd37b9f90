"""cbbench.workloads: deterministic request streams from distributions, traces and presets.

```python
from cbbench.workloads import load_workload, with_arrivals
wl = load_workload("mixed", seed=0, num_requests=100)  # preset, trace path or spec file
wl = with_arrivals(wl, "poisson", rate=4.0)             # only arrival_s changes
```

Layer: workloads (the bottom: request streams, and the statistics helpers everyone shares).
Imports: nothing.
"""

from cbbench.workloads.arrivals import ARRIVAL_KINDS, with_arrivals
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.loader import load_trace, load_workload, summarize_big
from cbbench.workloads.native import write_native_jsonl
from cbbench.workloads.presets import PRESETS, Preset
from cbbench.workloads.spec import RequestSpec, Workload
from cbbench.workloads.summary import summarize_workload

__all__ = [
    "ARRIVAL_KINDS",
    "PRESETS",
    "Preset",
    "RequestSpec",
    "Workload",
    "WorkloadError",
    "load_trace",
    "load_workload",
    "summarize_big",
    "summarize_workload",
    "with_arrivals",
    "write_native_jsonl",
]
