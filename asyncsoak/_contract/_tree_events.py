"""The events of the process tree's life and its stop, each beside its JSON form, from the
journal's header to its end."""

# No ``from __future__ import annotations``: TypedDict reads ``NotRequired`` when evaluated.
from typing import Any, ClassVar, Literal, NotRequired

from ._event import Event, EventJsonBase
from ._vocabulary import EventKind


class Header(Event):
    """First journal line: everything needed to rebuild the artifact from the journal."""

    KIND: ClassVar[str] = EventKind.HEADER

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


class Snapshot(Event):
    """Where the run came from: source, GPUs, software, host, environment (redacted)."""

    KIND: ClassVar[str] = EventKind.SNAPSHOT

    data: dict[str, Any]


class SnapshotJson(EventJsonBase):
    kind: Literal[EventKind.SNAPSHOT]
    data: dict[str, Any]


class Started(Event):
    """The command is running; ``pid`` leads its own session and process group."""

    KIND: ClassVar[str] = EventKind.STARTED

    pid: int
    reaper_pid: int


class StartedJson(EventJsonBase):
    kind: Literal[EventKind.STARTED]
    pid: int
    reaper_pid: int


class SpawnFailed(Event):
    KIND: ClassVar[str] = EventKind.SPAWN_FAILED

    message: str


class SpawnFailedJson(EventJsonBase):
    kind: Literal[EventKind.SPAWN_FAILED]
    message: str


class Exited(Event):
    """The command itself ended.  ``returncode`` is negative for a signal, as in Python."""

    KIND: ClassVar[str] = EventKind.EXITED

    pid: int
    returncode: int
    signal: str | None


class ExitedJson(EventJsonBase):
    kind: Literal[EventKind.EXITED]
    pid: int
    returncode: int
    signal: str | None


class TreeGone(Event):
    """Every process of the tree has been reaped."""

    KIND: ClassVar[str] = EventKind.TREE_GONE


class TreeGoneJson(EventJsonBase):
    kind: Literal[EventKind.TREE_GONE]


class StopRequested(Event):
    """The monitor decided to end the run: ``cause`` is why."""

    KIND: ClassVar[str] = EventKind.STOP

    cause: str
    mode: str
    grace_seconds: float


class StopJson(EventJsonBase):
    kind: Literal[EventKind.STOP]
    cause: str  # a StopCause
    mode: str
    grace_seconds: float


class SignalSent(Event):
    KIND: ClassVar[str] = EventKind.SIGNAL

    signal: str
    target: str
    pids: list[int]


class SignalJson(EventJsonBase):
    kind: Literal[EventKind.SIGNAL]
    signal: str
    target: str
    pids: list[int]


class SignalForwarded(Event):
    """A signal the monitor received (``--forward-signal``), passed on to the command."""

    KIND: ClassVar[str] = EventKind.FORWARDED

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


class Requeued(Event):
    """The scheduler was asked to requeue the job (``--requeue-on``): its answer."""

    KIND: ClassVar[str] = EventKind.REQUEUE

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


class StdinClosed(Event):
    KIND: ClassVar[str] = EventKind.STDIN_CLOSED


class StdinClosedJson(EventJsonBase):
    kind: Literal[EventKind.STDIN_CLOSED]


class Leftover(Event):
    """A process of the tree still alive when it should have been gone."""

    KIND: ClassVar[str] = EventKind.LEFTOVER

    process: dict[str, Any]


class LeftoverJson(EventJsonBase):
    kind: Literal[EventKind.LEFTOVER]
    process: dict[str, Any]


class Abandoned(Event):
    """A process that would not die within the bounded wait (often stuck in ``D``)."""

    KIND: ClassVar[str] = EventKind.ABANDONED

    process: dict[str, Any]


class AbandonedJson(EventJsonBase):
    kind: Literal[EventKind.ABANDONED]
    process: dict[str, Any]


class Forensics(Event):
    """What every process of a stalled tree was doing, recorded before the first signal."""

    KIND: ClassVar[str] = EventKind.FORENSICS

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


class OomKill(Event):
    """The kernel's OOM killer ended a process of the tree."""

    KIND: ClassVar[str] = EventKind.OOM_KILL

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


class CrashCause(Event):
    """What the end of a failed command's log says killed it (``exit.exception``)."""

    KIND: ClassVar[str] = EventKind.EXCEPTION

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


class Finished(Event):
    """Last journal line of a soak whose monitor lived to the end."""

    KIND: ClassVar[str] = EventKind.FINISHED

    status: str


class FinishedJson(EventJsonBase):
    kind: Literal[EventKind.FINISHED]
    status: str  # a SoakStatus
