"""The loop-lateness record that bounds merged reads (harness/client/lateness.py)."""

from cbbench.harness.client.lateness import SHIFT, SIZE, Lateness

MS = 1_000_000
T0 = 1 << 40


def test_an_idle_gap_is_not_lateness_but_a_stall_ended_by_a_late_read_is():
    late = Lateness()
    late.read(T0, T0 + MS // 10)  # a burst
    late.read(T0 + 300 * MS, T0 + 300 * MS + MS // 10)  # idle 300 ms, then woken at once
    assert late.worst(T0, T0 + 301 * MS) < MS
    # idle again, then a 40 ms stall: the read after it finds bytes 3 ms old (their last
    # segment), but the loop had read nothing since the burst before
    late.read(T0 + 400 * MS, T0 + 400 * MS + MS // 10)
    late.read(T0 + 437 * MS, T0 + 440 * MS)  # since two bursts back: 300.1
    assert late.worst(T0 + 401 * MS, T0 + 440 * MS) >= 139 * MS
    assert late.worst(T0 + 500 * MS, T0 + 600 * MS) == 0  # nothing seen there


def test_a_probe_lag_covers_its_interval_and_a_lapped_ring_errs_high():
    late = Lateness()
    late.note(T0, 25 * MS, T0 + 125 * MS)
    assert late.worst(T0 + 100 * MS, T0 + 101 * MS) == 25 * MS
    late.note(T0 + (SIZE + 1 << SHIFT), MS)  # a ring lap later: old buckets stay, larger
    assert late.worst(T0 + (SIZE << SHIFT), T0 + (SIZE + 2 << SHIFT)) >= MS
    assert late.worst(T0, T0 + (2 * SIZE << SHIFT)) == 25 * MS  # longer than the ring: all
