"""Address validation and the file layout (docs/reference.md §2-§3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actorkeep.address import (
    actor_path,
    check_actor_name,
    check_class_name,
    split_address,
)

NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~:@+=-"
valid_names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=200).filter(
    lambda s: not s.startswith(".")
)
valid_classes = st.from_regex(r"[a-z][a-z0-9-]{0,62}", fullmatch=True)


@pytest.mark.parametrize(
    "name", ["a", "A", "user:42", "x@y+z=1~", "a" * 200, "-", "a.b", "a..", "a_b", "_", "_x"]
)
def test_valid_names(name: str) -> None:
    assert check_actor_name(name) == name


@given(valid_names)
def test_every_name_of_the_documented_alphabet_is_valid(name: str) -> None:
    """1-200 characters of [A-Za-z0-9._~:@+=-], not starting with '.' (docs/reference.md §2)."""
    assert check_actor_name(name) == name
    assert split_address(f"c/{name}") == ("c", name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        ".hidden",
        "a/b",
        "a\\b",
        "a b",
        "a\x00",
        "é",
        "a" * 201,
        "a%2F",
        "a?b",
        "a\n",
    ],
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(ValueError, match="invalid actor name"):
        check_actor_name(name)


@pytest.mark.parametrize("name", ["", "A", "1a", "a_b", "a" * 64, "-a", "a/b", "ab.c"])
def test_invalid_class_names(name: str) -> None:
    with pytest.raises(ValueError, match="invalid actor class name"):
        check_class_name(name)


def test_split_address() -> None:
    assert split_address("counter/a") == ("counter", "a")
    for bad in ["counter", "counter/", "/a", "counter/a/b", "Counter/a", "counter/.a"]:
        with pytest.raises(ValueError):
            split_address(bad)


@given(valid_classes, valid_names)
def test_path_stays_inside_root(class_name: str, name: str) -> None:
    root = Path("/data/actors")
    path = actor_path(root, class_name, name)
    assert path.resolve().is_relative_to(root)
    assert path.suffix == ".sqlite"
    assert len(path.name) <= 255
    assert path.relative_to(root).parts[0] == class_name
    assert len(path.relative_to(root).parts) == 4  # class / aa / bb / file: fan-out


@given(valid_names, valid_names)
def test_distinct_names_never_share_a_file(a: str, b: str) -> None:
    if a != b:
        root = Path("/r")
        pa, pb = actor_path(root, "c", a), actor_path(root, "c", b)
        assert pa != pb
        # nor on a case-insensitive disk
        assert str(pa).lower() != str(pb).lower()


@given(st.text(max_size=300))
def test_any_text_is_either_valid_or_refused(name: str) -> None:
    try:
        check_actor_name(name)
    except ValueError:
        return
    assert all(c in NAME_CHARS for c in name) and not name.startswith(".")
    assert 1 <= len(name) <= 200


def test_fan_out_spreads_names() -> None:
    root = Path("/r")
    dirs = {actor_path(root, "c", f"user-{i}").parent for i in range(20_000)}
    assert len(dirs) > 10_000  # 20,000 names land in (almost) as many directories
