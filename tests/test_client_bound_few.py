"""A CLIENT-BOUND verdict needs sustained lag, never one or two samples: a Mooncake replay on
tiny sent 2 requests (18 of 20 too long), each ~2 ms late, and was called client-bound."""

from __future__ import annotations

import numpy as np
from cbbench.harness.results.client_timing import client_bound_reasons
from cbbench.workloads.stats import describe_array

QUIET = {"loop_lag_s": describe_array(np.array([0.001])), "cpu": describe_array(np.array([0.1]))}


def test_two_late_sends_are_no_verdict():
    assert client_bound_reasons(np.array([0.0021, 0.0031]), np.array([0.001]), QUIET) == []


def test_typical_lag_over_enough_sends_is_a_verdict():
    reasons = client_bound_reasons(np.full(5, 0.003), np.array([0.001]), QUIET)
    assert reasons and "send lag p50 3.0 ms" in reasons[0]
