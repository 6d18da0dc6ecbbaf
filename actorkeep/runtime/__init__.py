"""The runtime: the host that runs actors, their storage, their alarms (docs/decisions/0014).

Nothing here knows HTTP servers or ASGI; the edge (``actorkeep.front``, ``.server``, ``.asgi``,
``.cli``) calls into it, and the SDK clients go through an actor's public call path.
"""
