"""The `ratchet` command.

`quick` is its entry point: the read commands on a SQLite store answer there, before typer,
rich or pydantic load; everything else goes to the full CLI, `app`. This package's `__init__`
imports nothing, so that importing `ratchet.cli.quick` stays quick.
"""
