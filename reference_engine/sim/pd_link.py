"""Which KV link and which per-hop overhead a P/D simulation (`sim --prefill-replicas`,
`plan`'s disaggregated points) prices, and one line saying where they came from.

A hardware JSON from `calibrate --from-run RUNS --kv-handoff PD_RUNS` carries the measured
hand-off as `fit.kv_link` (pd_handoff.py: all of a disaggregated request's TTFT that is
neither its prefill queue, its prefill, its decode queue nor the ONE request overhead the
fit prices, so it holds the decode server's front end). It is the default link; an explicit
link wins (`--kv-link`, `plan --space kv_link=...`); `fit` names it explicitly.

A from-run fit's request overhead (`c_req`, `c_req_load`) is one server's front end. A P/D
request crosses two: the prefill server's (paid before it reaches the prefill worker, as an
aggregated request pays it) and the decode server's (paid after the link). With a measured
hand-off the second is already in the link, so it is paid once; with any other link it is
paid again on the decode hop (`simulate_pd(..., decode_overhead=)`). The router's own hop
is not priced apart (no fit measures it alone; a measured hand-off holds it).
"""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.reference_engine.errors import EngineError

FIT = "fit"
DEFAULT = "same-node"


@dataclass(frozen=True)
class PDLink:
    spec: str  # a preset name or bandwidth_gbps=B,latency_ms=L (kv_link.get_link)
    source: str
    measured: bool  # the fit's measured hand-off: it holds the decode server's front end

    def decode_overhead(self, over: dict[str, float]) -> dict[str, float] | None:
        """The decode server's front end to pay on the second hop (None: none, or in the link)."""
        return None if self.measured or not any(over.values()) else over

    def line(self, over: dict[str, float]) -> str:
        hop = ("the decode server's front end inside it, request overhead paid once"
               if self.measured else "the fit's request overhead paid on both server hops "
               "(prefill server, decode server)" if any(over.values()) else "")  # fmt: skip
        return f"KV link: {self.spec} ({self.source})" + (f"; {hop}" if hop else "")


def resolve_link(value: str | None, hw) -> PDLink:
    """`value` None: the fit's measured hand-off if the hardware JSON carries one, else the
    same-node preset; 'fit': the fit's (an error without one); anything else as given."""
    fitted = (getattr(hw, "fit", None) or {}).get("kv_link")
    name = getattr(hw, "name", "the hardware")
    if value is None or value == FIT or (fitted and value == fitted):
        if fitted:
            return PDLink(fitted, f"measured hand-off, fit.kv_link of {name}", True)
        if value == FIT:
            raise EngineError(f"KV link 'fit': {name} carries no fit.kv_link (`cbbench calibrate "
                              "--from-run RUNS --kv-handoff PD_RUNS` saves one)")  # fmt: skip
        return PDLink(DEFAULT, "default preset; the hardware carries no measured hand-off", False)
    return PDLink(value, "given", False)
