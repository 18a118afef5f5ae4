"""A handle through which a caller (the job worker, an orchestrator) steers a running soak."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from .._contract import StopCause, ValidationError
from .._record import Observer


class SoakControl:
    """Pass one to ``run_soak(control=...)`` to watch and stop the soak from another task.

    ``request_stop()`` ends the run the way the soak's stop mode says (SIGTERM to the group or
    the leader, or closing the command's stdin), waits ``grace_seconds`` (default: the soak's
    ``post_shutdown_grace_seconds``) for the tree, then kills what is left.  A requested stop is
    not a failure: the soak returns its artifact with ``status: "cancelled"``.  ``cause`` is
    the artifact's ``stop.cause``, one of :class:`asyncsoak.artifact.StopCause`
    (``"scheduler"`` for a scheduler's SIGTERM, whose grace is kept under the scheduler's own
    kill deadline).  ``kill_now()`` (a second Ctrl-C) ends whatever grace the stop is in and
    kills the tree at once.

    ``observers`` (appended to before the soak starts) are called with the JSON form of every
    event as the serializer receives it (the artifact's builder has folded it; its journal
    line may wait for the next sample's write): the monitor's own knowledge, ahead of the
    journal (``asyncsoak run``'s live view is one).  An observer
    is called on the event loop: it must be quick and must not raise.

    ``progress_age`` (set once the watchdog runs) is a blocking look, for a thread, at the
    files that changed last: seconds since the newest change to them (by their mtimes), or
    None.  The live view calls it when it draws, so the time since the last progress it shows
    is the monitor's at that moment, not up to one scan late.
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

    def request_stop(
        self,
        *,
        reason: str = "requested",
        grace_seconds: float | None = None,
        cause: str = StopCause.REQUESTED,
    ) -> None:
        """Ask the soak to stop; later calls do not change the first request.

        Raises :class:`asyncsoak.ValidationError` for a ``cause`` that is no stop cause."""
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

    def _set_started(self, pid: int) -> None:
        self.pid = pid
        self.started.set()
