"""`RequestRecord.build` (the load generator's per-request constructor) is the dataclass's own
constructor: the same record, the same fields in the same order (the record line), lists and
dicts of its own, and a clear error for a name that is not a field."""

from __future__ import annotations

import dataclasses

import pytest
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import _json_bytes
from hypothesis import given
from hypothesis import strategies as st

NAMES = [f.name for f in dataclasses.fields(RequestRecord)][4:]
VALUES = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5))


@given(
    st.text(max_size=8),
    st.integers(0, 10**6),
    st.integers(0, 10**5),
    st.integers(0, 10**5),
    st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=6),
)
def test_build_is_the_constructor(rid, index, prompt_len, output_len, extra_fields):
    a = RequestRecord(rid, index, prompt_len, output_len, **extra_fields)
    b = RequestRecord.build(rid, index, prompt_len, output_len, **extra_fields)
    assert a == b
    assert list(a.__dict__) == list(b.__dict__)  # the record line's key order
    assert _json_bytes(a.__dict__) == _json_bytes(b.__dict__)
    assert type(b) is RequestRecord and b.ok == a.ok


def test_build_gives_each_record_its_own_lists_and_dicts():
    a = RequestRecord.build("a", 0, 1, 1)
    b = RequestRecord.build("b", 1, 1, 1)
    a.token_times_s.append(1.0)
    a.itl_s.append(1.0)
    a.stream_flags.append("x")
    a.extra["k"] = 1
    assert b.token_times_s == [] and b.itl_s == [] and b.stream_flags == [] and b.extra == {}
    assert RequestRecord.build("c", 2, 1, 1) == RequestRecord("c", 2, 1, 1)


def test_build_names_a_field_that_does_not_exist():
    with pytest.raises(TypeError, match="no field 'nope'"):
        RequestRecord.build("a", 0, 1, 1, nope=1)
