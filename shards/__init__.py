"""Ready actor classes for shared data: ``KVShard`` (docs/reference.md §7)."""

from .kv import KVShard

__all__ = ["KVShard"]
