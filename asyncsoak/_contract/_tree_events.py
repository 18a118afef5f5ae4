"""The events of the process tree's life and its stop, each beside its JSON form, from the
journal's header to its end."""

# No ``from __future__ import annotations``: TypedDict reads ``NotRequired`` when evaluated.
from typing import Any, Literal, NotRequired

from ._event import Event, EventJsonBase
from ._vocabulary import EventKind


class Header(Event, kind=EventKind.HEADER):
    """First journal line: everything needed to rebuild the artifact from the journal."""

    command: list[str]
    cwd: str
    config: dict[str, Any]
    metadata: dict[str, Any]
    started_at: str
    journal_path: str
    log_path: str
    output_path: str
    monitor_pid: int
    #: The monitor's monotonic clock at the start (CLOCK_MONOTONIC is system-wide).
    monotonic_start: float


class HeaderJson(EventJsonBase):
    kind: Literal[EventKind.HEADER]
    command: list[str]
    cwd: str
    config: dict[str, Any]
    metadata: dict[str, Any]
    started_at: str
    journal_path: str
    log_path: str
    output_path: str
    monitor_pid: int
    monotonic_start: float


class Snapshot(Event, kind=EventKind.SNAPSHOT):
    """Where the run came from: source, GPUs, software, host, environment (redacted)."""

    data: dict[str, Any]


class SnapshotJson(EventJsonBase):
    kind: Literal[EventKind.SNAPSHOT]
    data: dict[str, Any]


class Started(Event, kind=EventKind.STARTED):
    """The command is running; ``pid`` leads its own session and process group."""

    pid: int
    reaper_pid: int


class StartedJson(EventJsonBase):
    kind: Literal[EventKind.STARTED]
    pid: int
    reaper_pid: int


class SpawnFailed(Event, kind=EventKind.SPAWN_FAILED):
    message: str


class SpawnFailedJson(EventJsonBase):
    kind: Literal[EventKind.SPAWN_FAILED]
    message: str


class Exited(Event, kind=EventKind.EXITED):
    """The command itself ended.  ``returncode`` is negative for a signal, as in Python."""

    pid: int
    returncode: int
    signal: str | None


class ExitedJson(EventJsonBase):
    kind: Literal[EventKind.EXITED]
    pid: int
    returncode: int
    signal: str | None


class TreeGone(Event, kind=EventKind.TREE_GONE):
    """Every process of the tree has been reaped."""


class TreeGoneJson(EventJsonBase):
    kind: Literal[EventKind.TREE_GONE]


class StopRequested(Event, kind=EventKind.STOP):
    """The monitor decided to end the run: ``cause`` is why."""

    cause: str
    mode: str
    grace_seconds: float


class StopJson(EventJsonBase):
    kind: Literal[EventKind.STOP]
    cause: str  # a StopCause
    mode: str
    grace_seconds: float


class SignalSent(Event, kind=EventKind.SIGNAL):
    signal: str
    target: str
    pids: list[int]


class SignalJson(EventJsonBase):
    kind: Literal[EventKind.SIGNAL]
    signal: str
    target: str
    pids: list[int]


class SignalForwarded(Event, kind=EventKind.FORWARDED):
    """A signal the monitor received (``--forward-signal``), passed on to the command."""

    signal: str
    target: str
    pids: list[int]
    sent: bool


class ForwardedJson(EventJsonBase):
    kind: Literal[EventKind.FORWARDED]
    signal: str
    target: str
    pids: list[int]
    sent: bool


class Requeued(Event, kind=EventKind.REQUEUE):
    """The scheduler was asked to requeue the job (``--requeue-on``): its answer."""

    job_id: str
    ok: bool
    returncode: int | None
    message: str


class RequeueJson(EventJsonBase):
    kind: Literal[EventKind.REQUEUE]
    job_id: str
    ok: bool
    returncode: int | None
    message: str


class StdinClosed(Event, kind=EventKind.STDIN_CLOSED):
    pass


class StdinClosedJson(EventJsonBase):
    kind: Literal[EventKind.STDIN_CLOSED]


class Leftover(Event, kind=EventKind.LEFTOVER):
    """A process of the tree still alive when it should have been gone."""

    process: dict[str, Any]


class LeftoverJson(EventJsonBase):
    kind: Literal[EventKind.LEFTOVER]
    process: dict[str, Any]


class Abandoned(Event, kind=EventKind.ABANDONED):
    """A process that would not die within the bounded wait (often stuck in ``D``)."""

    process: dict[str, Any]


class AbandonedJson(EventJsonBase):
    kind: Literal[EventKind.ABANDONED]
    process: dict[str, Any]


class Forensics(Event, kind=EventKind.FORENSICS):
    """What every process of a stalled tree was doing, recorded before the first signal."""

    reason: str
    data: dict[str, Any]


class ForensicsJson(EventJsonBase):
    kind: Literal[EventKind.FORENSICS]
    reason: str
    data: dict[str, Any]


class ForensicsMentionJson(EventJsonBase):
    """What ``artifact.events`` keeps of a forensics event: its ``forensics`` section holds
    the record itself."""

    kind: Literal[EventKind.FORENSICS]
    processes: int


class OomKill(Event, kind=EventKind.OOM_KILL):
    """The kernel's OOM killer ended a process of the tree."""

    pid: int
    name: str
    message: str
    detected_by: tuple[str, ...] = ("kernel_log",)
    cgroup_path: str | None = None
    cgroup_memory_limit_bytes: int | None = None


class OomKillJson(EventJsonBase):
    kind: Literal[EventKind.OOM_KILL]
    pid: int
    name: str
    message: str
    detected_by: NotRequired[list[str]]
    cgroup_path: NotRequired[str | None]
    cgroup_memory_limit_bytes: NotRequired[int | None]


class CrashCause(Event, kind=EventKind.EXCEPTION):
    """What the end of a failed command's log says killed it (``exit.exception``)."""

    type: str
    message: str
    where: str | None
    exception_kind: str
    rank: int | None = None
    rank_pid: int | None = None


class ExceptionJson(EventJsonBase):
    kind: Literal[EventKind.EXCEPTION]
    type: str
    message: str
    where: str | None
    exception_kind: str
    rank: NotRequired[int | None]
    rank_pid: NotRequired[int | None]


class Finished(Event, kind=EventKind.FINISHED):
    """Last journal line of a soak whose monitor lived to the end."""

    status: str


class FinishedJson(EventJsonBase):
    kind: Literal[EventKind.FINISHED]
    status: str  # a SoakStatus
