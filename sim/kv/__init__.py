"""The KV scenario: its workload, checkers, planted bugs and ``KV``."""

from .bugs import BUGS
from .checker import check_kv
from .exhaustive import check_kv_exhaustive
from .scenario import KV

__all__ = ["BUGS", "KV", "check_kv", "check_kv_exhaustive"]
