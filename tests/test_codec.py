"""The codec and the wire's reply checks."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actorkeep import codec, wire


class _Packing(dict[str, Any]):
    """A dict whose items() packs something else first: packing calls back into Python."""

    def items(self) -> Any:
        codec.pack({"inner": [1, 2, 3]})
        return super().items()


def test_a_pack_inside_a_pack_does_not_corrupt_the_outer_value() -> None:
    value = {"outer": _Packing(x=1), "after": b"bytes"}
    assert msgpack.unpackb(codec.pack(value), raw=False) == {"outer": {"x": 1}, "after": b"bytes"}
    assert codec.pack({"a": 1}) == msgpack.packb({"a": 1}, use_bin_type=True)


def test_a_reply_with_a_field_the_operation_does_not_answer_is_refused() -> None:
    op = wire.queue.DELIVER
    good = codec.pack({"outcomes": []})
    assert op.reply(good) == {"outcomes": []}
    with pytest.raises(ValueError, match="malformed reply"):
        op.reply(codec.pack({"outcomes": [], "zz": 1}))


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
)
_arguments = st.dictionaries(
    st.text(max_size=6),
    st.one_of(_scalars, st.lists(_scalars, max_size=3), st.dictionaries(st.text(), _scalars)),
    max_size=5,
)


@given(_arguments)
def test_copy_args_is_the_round_trip_it_stands_for(args: dict[str, Any]) -> None:
    try:
        expected: Any = codec.unpack(codec.pack(args))
    except Exception as exc:  # what the round trip refuses, the copy refuses the same way
        with pytest.raises(type(exc)):
            codec.copy_args(args)
        return
    copied = codec.copy_args(args)
    assert copied == expected and copied is not args
    assert [type(v) for v in copied.values()] == [type(v) for v in expected.values()]


_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.binary(max_size=2)), inner, max_size=3),
    ),
    max_leaves=12,
)


@given(_values)
def test_copy_value_is_the_round_trip_it_stands_for(value: Any) -> None:
    try:
        expected: Any = codec.unpack(codec.pack(value))
    except Exception as exc:  # what the round trip refuses, the copy refuses the same way
        with pytest.raises(type(exc)):
            codec.copy_value(value)
        return
    copied = codec.copy_value(value)
    assert copied == expected
    assert _shape(copied) == _shape(expected)  # types too: 1 and True, lists for tuples


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value)


def test_copy_value_copies_what_the_callee_could_change() -> None:
    inner = [1, [2]]
    reply = {"entries": [inner], "n": 1}
    copied = codec.copy_value(reply)
    copied["entries"][0][1].append(3)
    copied["entries"].append(4)
    assert reply == {"entries": [[1, [2]]], "n": 1}
    deep: Any = [0]
    for _ in range(8):  # deeper than it copies itself: the round trip does
        deep = [deep]
    assert codec.copy_value(deep) == deep and codec.copy_value(deep) is not deep


def test_copy_args_copies_what_the_callee_could_change() -> None:
    inner = [1, 2]
    copied = codec.copy_args({"xs": inner, "n": 1})
    copied["xs"].append(3)
    assert inner == [1, 2]
    assert codec.copy_args({"t": (1, 2)}) == {"t": [1, 2]}  # as msgpack gives it
