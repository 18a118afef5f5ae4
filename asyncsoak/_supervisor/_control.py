"""A handle through which a caller (the job worker, an orchestrator) steers a running soak."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .._contract import StopCause, ValidationError

if TYPE_CHECKING:
    from .._process import Spawner
    from .._record import Observer, RunState


class SoakControl:
    """Pass one to ``run_soak(control=...)`` to watch and stop the soak from another task.

    ``request_stop()`` stops the run as its stop mode says (``status: "cancelled"``, not a
    failure); ``kill_now()`` kills the tree at once; ``observers`` get each event's JSON form
    on the loop (quick, never raising); ``progress_age`` is a blocking look at the latest file
    change's age; ``state`` is the run's :class:`RunState`.  More: docs/running.md.
    """

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.stop_requested = anyio.Event()
        self.kill_requested = anyio.Event()
        self.pid: int | None = None
        self.reason: str | None = None
        self.grace_seconds: float | None = None
        self.cause = StopCause.REQUESTED
        self.observers: list[Observer] = []
        self.progress_age: Callable[[], float | None] | None = None
        self.state: RunState | None = None
        self._reaper: Spawner | None = None

    def request_stop(
        self,
        *,
        reason: str = "requested",
        grace_seconds: float | None = None,
        cause: str = StopCause.REQUESTED,
    ) -> None:
        """Ask the soak to stop (the first request holds); ``cause`` must be a stop cause."""
        try:
            stop_cause = StopCause(cause)
        except ValueError:
            known = ", ".join(StopCause)
            raise ValidationError(f"cause must be a stop cause ({known}), got {cause!r}") from None
        if self.stop_requested.is_set():
            return
        self.reason = reason
        self.cause = stop_cause
        self.grace_seconds = grace_seconds
        self.stop_requested.set()

    def kill_now(self) -> None:
        """Stop the soak (if it is not stopping yet) and kill its tree without any grace."""
        self.request_stop(reason="killed")
        self.kill_requested.set()

    async def _launch_reaper(self, stop_mode: str) -> None:
        """Start the reaper ahead of ``run_soak``'s imports (the CLI does), for the soak to take."""
        from .._process import Spawner

        self._reaper = Spawner()
        with contextlib.suppress(OSError):  # the soak launches one of its own
            await self._reaper.launch(stop_mode)

    def _take_reaper(self) -> Spawner | None:
        """The reaper launched ahead for this soak (once)."""
        reaper, self._reaper = self._reaper, None
        return reaper

    async def _drop_reaper(self) -> None:
        """Close the reaper launched ahead if no soak took it."""
        reaper = self._take_reaper()
        if reaper is not None:
            await reaper.close()

    def _set_started(self, pid: int) -> None:
        self.pid = pid
        self.started.set()
