"""The queue actor class (docs/reference.md §8): deploy with ``app.mount(queues.Queue, "queue")``.

Talk to it with ``ak.queue.Client("queue/<name>")`` from inside an actor's event.
"""

from .queue import Queue
from .recurring import Recurring

__all__ = ["Queue", "Recurring"]
