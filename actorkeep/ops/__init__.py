"""Operations: see and manage what a host holds, from the CLI and the admin API
(docs/operations.md).

``inspect`` reads a data directory without writing it, ``backup`` copies it, ``admin`` serves
the admin API, ``metrics`` the host's counters for Prometheus, ``source`` is where a command
reads (a running host or the directory itself), ``commands`` are the CLI's subcommands and
``repair`` the ones that fix a stopped host's directory.
"""
