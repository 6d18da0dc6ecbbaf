"""The migrations scenario: an app deployed three times under crashes and power loss, its
actors' schema migrated at activation (``scenario``), checked by ``checker``; planted bugs in
the runtime's migrate path (``bugs``)."""

from .bugs import MIGRATION_BUGS
from .checker import check_migrations
from .scenario import MIGRATIONS

__all__ = ["MIGRATIONS", "MIGRATION_BUGS", "check_migrations"]
