"""The queue scenario: its workload, checker, planted bugs and ``QUEUES``."""

from .bugs import QUEUE_BUGS
from .checker import check_queue
from .scenario import QUEUES

__all__ = ["QUEUES", "QUEUE_BUGS", "check_queue"]
