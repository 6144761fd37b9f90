"""Summary statistics: re-exported from workloads/stats.py (the one percentile helper)."""

from cbbench.workloads.stats import PERCENTILES, describe, describe_array

__all__ = ["PERCENTILES", "describe", "describe_array"]
