"""The alarm scenario: its workload, checker, planted bugs and ``ALARMS``."""

from .bugs import ALARM_BUGS
from .checker import check_alarms
from .scenario import ALARMS

__all__ = ["ALARMS", "ALARM_BUGS", "check_alarms"]
