"""What `ratchet serve` runs beside its routes: `ratchet worker`'s loop, on a thread of its own.

The worker is `LocalRuntime.worker`, the one `ratchet worker` runs, on a runtime of its own
opened on its thread for the store's scheme (SQLite or Postgres; the routes keep theirs), so a
decision taken on the approval page is worked on at once, with no other command. It lives and
dies with the server's process: nothing outlives a SIGTERM, a Ctrl-C or a SIGKILL, so no
orphan keeps a lease. On shutdown it is stopped after the step it is on; one still running
after `STOP_SECONDS` is left to the process's end, as a killed worker's is: its lease lapses
and the next worker resumes the run from its last checkpoint.

If the worker stops on its own (its id is taken, or a call it abandoned still runs, which only
the end of the process ends), `on_stopped` is told, and `ratchet serve` stops too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ratchet.runtime import local_runtime
from ratchet.runtime.local import LocalRuntime, LocalSettings

STOP_SECONDS = 10.0
"""How long shutdown waits for the step the worker is on."""


class ServeWorker:
    def __init__(
        self,
        settings: LocalSettings,
        *,
        worker_id: str,
        logger: Any,
        on_park: Callable[[LocalRuntime, str], None],
        on_stopped: Callable[[BaseException | None], None],
    ) -> None:
        self._settings = settings
        self._worker_id = worker_id
        self._logger = logger
        self._on_park = on_park
        self._on_stopped = on_stopped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="ratchet serve worker", daemon=True)

    @property
    def worker_id(self) -> str:
        return self._worker_id

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_SECONDS) -> bool:
        """Stop after the current step; whether the worker stopped within `timeout`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _work(self) -> None:
        failure: BaseException | None = None
        try:
            runtime = local_runtime(self._settings, create=True)
            try:
                worker = runtime.worker(
                    worker_id=self._worker_id,
                    logger=self._logger,
                    on_park=lambda run_id: self._on_park(runtime, run_id),
                    stop=self._stop,
                )
                worker.run()
            finally:
                runtime.close()
        except BaseException as error:  # the thread's end: whatever ended it is told
            failure = error
        if not self._stop.is_set():
            self._on_stopped(failure)
