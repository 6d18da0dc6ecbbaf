"""Operations: see what a host holds, from the CLI and the admin API (docs/operations.md).

``inspect`` reads a data directory without writing it, ``admin`` serves it on the admin
listener, ``source`` is where a command reads (a running host or the directory itself), and
``commands`` are the CLI's subcommands.
"""
