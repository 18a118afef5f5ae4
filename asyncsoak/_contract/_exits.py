"""Exit statuses decoded in one place, and said in one set of words: Python reports a child
killed by signal N as ``-N``, a shell wrapper as ``128 + N``."""

from __future__ import annotations

import signal
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

#: A shell reports a child killed by signal N as exit status ``SHELL_SIGNAL_BASE + N``.
SHELL_SIGNAL_BASE = 128


class ExitStatus(NamedTuple):
    """What a returncode says: the signal that ended the process, or the one a shell saw."""

    returncode: int | None
    #: The signal that killed the process itself (a negative returncode).
    signal: int | None
    #: The signal a shell wrapper probably reported as ``128 + N``.
    shell_signal: int | None

    @property
    def signal_name(self) -> str | None:
        return None if self.signal is None else signal_name(self.signal)

    @property
    def maybe_oom(self) -> bool:
        """SIGKILL, directly or through a shell: often the kernel's OOM killer."""
        return signal.SIGKILL in (self.signal, self.shell_signal)


def decode(returncode: int | None) -> ExitStatus:
    """Decode a returncode as Python reports it (negative for a signal)."""
    if returncode is None or returncode >= 0:
        shell = None
        if returncode is not None and 0 < returncode - SHELL_SIGNAL_BASE < signal.NSIG:
            shell = returncode - SHELL_SIGNAL_BASE
        return ExitStatus(returncode, None, shell)
    return ExitStatus(returncode, -returncode, None)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 65`` for a number without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def signals_sent(
    artifact: Mapping[str, Any], *, killed_by_worker: bool = False
) -> list[str] | None:
    """The signals the monitor (or the worker, killing the tree itself) sent, or None when the
    artifact does not say."""
    stop = artifact.get("stop") or {}
    if "signals" not in stop and not killed_by_worker:
        return None
    sent = [str(s.get("signal")) for s in stop.get("signals") or []]
    return [*sent, "SIGKILL"] if killed_by_worker else sent


def forwarded_signals(artifact: Mapping[str, object]) -> list[str]:
    """The names of the signals the monitor passed on to the command (``--forward-signal``),
    from an artifact's ``forwarded`` events."""
    events = artifact.get("events")
    if not isinstance(events, list):
        return []
    return [
        str(e.get("signal"))
        for e in events
        if isinstance(e, Mapping) and e.get("kind") == "forwarded" and e.get("sent")
    ]


def describe_exit_status(
    returncode: int | None,
    *,
    sent: Collection[str] | None = None,
    forwarded: Collection[str] = (),
) -> str:
    """An exit status in the words every view and error uses.  ``sent``: the signals the
    monitor sent, when known, to say whether the killing one was its own; ``forwarded``: those
    it passed on (``--forward-signal``).  A SIGKILL not the monitor's may be the OOM killer."""
    status = decode(returncode)
    if status.returncode is None:
        return "exit status unknown (no exit was recorded)"
    number = status.signal if status.signal is not None else status.shell_signal
    if number is None:
        return f"exit status {status.returncode}"
    name = signal_name(number)
    by_monitor = None if sent is None else name in sent
    oom = "; often the kernel's out-of-memory killer" if status.maybe_oom and not by_monitor else ""
    if status.signal is None:
        return (
            f"exit status {status.returncode} (128+{number}: probably {name} through a shell{oom})"
        )
    if name in forwarded and not by_monitor:
        return (
            f"killed by {name} (signal {number}, forwarded by the monitor: it received "
            f"{name} and passed it on{oom})"
        )
    who = {None: "", True: ", sent by the monitor", False: ", not sent by the monitor"}
    return f"killed by {name} (signal {number}{who[by_monitor]}{oom})"
