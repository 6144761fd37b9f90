import pytest
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import parse_slo, summarize


def _records():
    r0 = RequestRecord("a", 0, 10, 3, sent_s=0.0, end_s=0.5, ttft_s=0.1, tpot_s=0.02, e2e_s=0.5)
    r0.itl_s, r0.output_tokens_server, r0.prompt_tokens_client, r0.prompt_tokens_server = (
        [0.01, 0.03],
        3,
        10,
        10,
    )
    r1 = RequestRecord("b", 1, 5, 4, sent_s=0.2, end_s=1.2, ttft_s=0.3, tpot_s=0.04, e2e_s=1.0)
    r1.itl_s, r1.output_tokens_server, r1.prompt_tokens_client, r1.prompt_tokens_server = (
        [0.05],
        2,
        5,
        7,
    )
    r1.scheduled_s, r1.client_queue_s, r1.send_lag_s, r1.server_queue_s = 0.0, 0.2, 0.001, 0.004
    r2 = RequestRecord(
        "c",
        2,
        5,
        4,
        sent_s=0.3,
        end_s=0.4,
        status="error",
        error="HTTP 500: boom 17",
        error_kind="http_5xx",
    )
    r3 = RequestRecord("w", 3, 5, 4, warmup=True, sent_s=-1.0, ttft_s=9.0, e2e_s=9.0)
    return [r0, r1, r2, r3]


def test_summary_matches_hand_computation():
    s = summarize(_records(), duration_s=2.0, slo={"ttft": 0.2})
    c = s["counts"]
    assert c == {
        "total": 3,
        "completed": 2,
        "failed": 1,
        "warmup_excluded": 1,
        "short_outputs": 1,
        "prompt_token_mismatch": 1,
        "output_token_mismatch": 0,
        "token_count_mismatch": 0,
    }
    assert s["error_rate"] == pytest.approx(1 / 3)
    assert s["errors_by_kind"] == {"http_5xx": 1}
    assert s["errors_by_reason"] == {"HTTP 500: boom 17": 1}  # grouped, shown verbatim
    assert s["ttft_s"]["mean"] == pytest.approx(0.2) and s["ttft_s"]["count"] == 2
    assert s["ttft_s"]["max"] == pytest.approx(0.3)  # the warmup's 9.0 is left out
    assert s["e2e_s"]["p50"] == pytest.approx(0.75)
    assert s["itl_s"]["p50"] == pytest.approx(0.03) and s["itl_s"]["count"] == 3
    assert s["client_queue_s"]["mean"] == pytest.approx(0.2) and s["client_queue_s"]["count"] == 1
    assert s["server_queue_s"]["mean"] == pytest.approx(0.004)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(2.5)  # (3 + 2) / 2 s
    assert s["total_token_throughput"] == pytest.approx((5 + 10 + 7) / 2)
    assert s["prompt_token_mismatch_mean"] == pytest.approx(2.0)
    g = s["goodput"]
    assert g["requests"] == 1 and g["requests_per_s"] == pytest.approx(0.5)
    assert g["fraction"] == pytest.approx(1 / 3)
    assert s["client_bound"] is False


def test_duration_defaults_to_t0_until_last_end():
    s = summarize(_records())
    assert s["duration_s"] == pytest.approx(1.2)


def test_client_bound_from_loop_lag_and_send_lag():
    recs = _records()
    s = summarize(recs, 2.0, client={"loop_lag_s": [0.05] * 10, "cpu": [0.2]})
    assert s["client_bound"] and "event-loop lag" in s["client_bound_reason"]
    recs[1].send_lag_s = 0.5
    assert summarize(recs, 2.0)["client_bound"] is False  # one late send is no verdict
    for r in recs:  # every scheduled send (3, SUSTAINED_MIN_SAMPLES) late
        r.scheduled_s, r.send_lag_s = 0.0, 0.5
    s = summarize(recs, 2.0)
    assert s["client_bound"] and "send lag" in s["client_bound_reason"]


def test_loop_lag_limit_is_stricter_with_user_space_stamps():
    """8 ms of loop lag is 8 ms of timing error when reads are stamped in user space (flag
    it), none with kernel stamps (a read waits, its time does not)."""
    lag = {"loop_lag_s": [0.008] * 10, "cpu": [0.2]}
    user = summarize(_records(), 2.0, client={**lag, "timestamp_source": "user"})
    kernel = summarize(_records(), 2.0, client={**lag, "timestamp_source": "kernel"})
    assert user["client_bound"] and "user-space arrival stamps" in user["client_bound_reason"]
    assert kernel["client_bound"] is False


def test_empty_run_has_absent_statistics():
    s = summarize([], 0.0)
    assert s["ttft_s"]["count"] == 0 and s["ttft_s"]["p99"] is None
    assert s["request_throughput"] is None and s["error_rate"] == 0.0


def test_parse_slo():
    assert parse_slo("ttft=200ms,tpot=50ms,e2e=10s") == pytest.approx(
        {"ttft": 0.2, "tpot": 0.05, "e2e": 10.0}
    )
    for bad in ("ttft", "foo=1s", "ttft=fast", "ttft=200", "ttft:200"):
        with pytest.raises(CbbenchError, match="--slo"):
            parse_slo(bad)
