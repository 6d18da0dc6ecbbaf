"""The codec and the wire's reply checks."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

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
