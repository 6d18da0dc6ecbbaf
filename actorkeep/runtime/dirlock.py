"""The data directory's lock: while a host has the directory open, ``<root>/host/lock`` holds
an exclusive ``flock``, so that two hosts never run the same actors (and fire the same alarms)
from one directory. ``<root>/host/cluster`` marks the directory of a cluster's host, whose
actor files are working copies (the operations commands do not write them)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

#: The file that marks a cluster host's data directory (under ``host/``).
CLUSTER_MARK = "cluster"


class DataDirInUse(OSError):
    """Another host holds the data directory."""


def lock_data_dir(root: Path) -> int:
    """Take the lock of the data directory ``root`` (its ``host/`` folder exists); the
    descriptor that holds it (closing it releases the lock). ``DataDirInUse`` if another
    process holds it."""
    fd = os.open(root / "host" / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(f"data directory {str(root)!r} is in use by another host") from None
    return fd
