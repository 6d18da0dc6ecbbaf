"""Ready actor classes for shared data: ``KVShard`` (SPEC §7)."""

from .kv import KVShard

__all__ = ["KVShard"]
