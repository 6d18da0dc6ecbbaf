"""Class names, actor names, addresses, and the file an actor lives in (docs/reference.md §2-§3)."""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

CLASS_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")
ACTOR_NAME_RE = re.compile(r"[A-Za-z0-9._~:@+=-]{1,200}")

# Characters kept as they are in file names. Everything else (upper case, ~ : @ + =) is escaped
# as %XX, so names that differ only in case never share a file on case-insensitive disks.
_SAFE_FILE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")
_MAX_FILE_STEM = 200


def check_class_name(name: str) -> str:
    """Return ``name`` if it is a valid actor class name, else raise ``ValueError``."""
    if not isinstance(name, str) or CLASS_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid actor class name {name!r}: want [a-z][a-z0-9-]{{0,62}}")
    return name


def check_actor_name(name: str) -> str:
    """Return ``name`` if it is a valid actor name, else raise ``ValueError``."""
    if not isinstance(name, str) or ACTOR_NAME_RE.fullmatch(name) is None or name[0] == ".":
        raise ValueError(
            f"invalid actor name {name!r}: want 1-200 characters of [A-Za-z0-9._~:@+=-], "
            "not starting with '.'"
        )
    return name


def split_address(address: str) -> tuple[str, str]:
    """Split ``"<class>/<name>"`` into its validated parts, or raise ``ValueError``."""
    if not isinstance(address, str):
        raise ValueError(f"actor address must be a str, not {type(address).__name__}")
    return _split(str(address))


@functools.lru_cache(maxsize=4096)  # the same addresses are called again and again
def _split(address: str) -> tuple[str, str]:
    class_name, sep, name = address.partition("/")
    if not sep:
        raise ValueError(f"invalid actor address {address!r}: want '<class>/<name>'")
    return check_class_name(class_name), check_actor_name(name)


def _file_stem(name: str) -> str:
    stem = "".join(c if c in _SAFE_FILE_CHARS else f"%{ord(c):02X}" for c in name)
    if len(stem) > _MAX_FILE_STEM:
        # Too long for a file name once escaped: use the digest. `~` never appears in an
        # escaped stem (it is escaped itself), so the two forms cannot collide.
        stem = hashlib.sha256(name.encode()).hexdigest() + "~h"
    return stem


#: The class name no app may mount: its one address, ``OPERATOR``, is the caller identity of the
#: host's operator (the admin API and the CLI), which every class's access rules let through
#: (docs/operations.md).
OPERATOR_CLASS = "actorkeep"
OPERATOR = "actorkeep/operator"

_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def name_from_stem(stem: str) -> str | None:
    """The actor name a file stem was made from; None for a long name kept as its digest
    (its database holds the name, see ``storage.ACTOR_TABLE``) or a stem no name makes."""
    if stem.endswith("~h"):
        return None
    name = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), stem)
    try:
        check_actor_name(name)
    except ValueError:
        return None
    return name if _file_stem(name) == stem else None


def actor_path(root: Path, class_name: str, name: str) -> Path:
    """The SQLite file of an actor under ``root``.

    ``<root>/<class>/<aa>/<bb>/<stem>.sqlite`` where ``aa``/``bb`` come from a digest of the
    name: 65,536 directories per class, so a million actors leave ~15 files per directory.
    Both parts must already be validated; the result is always inside ``root``.
    """
    digest = hashlib.blake2b(name.encode(), digest_size=2).hexdigest()
    return root / class_name / digest[:2] / digest[2:] / f"{_file_stem(name)}.sqlite"
