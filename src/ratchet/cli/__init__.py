"""The `ratchet` command.

- `quick`: the entry point. The read commands on a SQLite store answer there, before typer,
  rich or pydantic load, through `readout` (what status, history and list print) and
  `store_file` (the store's file, read with sqlite3's C module); `start`, `approve` and
  `reject` are read by `quick_writes` without typer and done by `writes`, as the full CLI's
  commands do them; anything else goes to the full CLI, which never imports `quick` back.
- `app`: the full CLI, its typer app and `main`; the commands live by group in `runs` (start,
  run, worker), `inspection` (status, history, list, watch, show, verify, replay), `decisions`
  (approve, reject, link, retry, resume, cancel, fork), `housekeeping` (migrate, gc), `serve`
  (serve, demo) and `check` (the crash sweep of a user's agent), which share `options` (what
  they take) and `context` (what they act through).
- `progress`: the line per step that run, worker and watch print; `demo`: the offline demo.

This `__init__` imports nothing, so that importing `ratchet.cli.quick` stays quick.
"""
