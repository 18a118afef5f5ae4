"""Exit statuses decoded once: signals, SIGKILL's usual cause, signals seen through a shell."""

from __future__ import annotations

import signal

import pytest

from asyncsoak._contract._exits import decode, describe_exit_status, signal_name


@pytest.mark.parametrize(
    ("rc", "sig", "shell", "oom"),
    [
        (0, None, None, False),
        (3, None, None, False),
        (-9, 9, None, True),
        (-15, 15, None, False),
        (137, None, 9, True),
        (143, None, 15, False),
        (128, None, None, False),
        (128 + signal.NSIG, None, None, False),
        (None, None, None, False),
    ],
)
def test_decode(rc: int | None, sig: int | None, shell: int | None, oom: bool) -> None:
    """A negative returncode is the signal; 128+N is signal N through a shell; SIGKILL may
    be the OOM killer either way."""
    status = decode(rc)
    assert (status.signal, status.shell_signal, status.maybe_oom) == (sig, shell, oom)


OOM = "; often the kernel's out-of-memory killer"


@pytest.mark.parametrize(
    ("rc", "sent", "words"),
    [
        (-9, None, f"killed by SIGKILL (signal 9{OOM})"),
        (-9, [], f"killed by SIGKILL (signal 9, not sent by the monitor{OOM})"),
        (-9, ["SIGTERM", "SIGKILL"], "killed by SIGKILL (signal 9, sent by the monitor)"),
        (-15, None, "killed by SIGTERM (signal 15)"),
        (-15, ["SIGTERM"], "killed by SIGTERM (signal 15, sent by the monitor)"),
        (137, None, f"exit status 137 (128+9: probably SIGKILL through a shell{OOM})"),
        (137, ["SIGKILL"], "exit status 137 (128+9: probably SIGKILL through a shell)"),
        (143, [], "exit status 143 (128+15: probably SIGTERM through a shell)"),
        (1, None, "exit status 1"),
        (0, [], "exit status 0"),
        (None, None, "exit status unknown (no exit was recorded)"),
    ],
)
def test_the_words_name_the_signal_who_sent_it_and_its_usual_cause(
    rc: int | None, sent: list[str] | None, words: str
) -> None:
    """One wording: the signal's name and number, whether the monitor sent it when that is
    known, SIGKILL the monitor did not send is often the OOM killer, a shell's 128+N is
    probably signal N."""
    assert describe_exit_status(rc, sent=sent) == words


def test_an_unnamed_signal_is_given_by_number() -> None:
    """A signal number without a name (a real-time signal) is still said."""
    assert signal_name(signal.SIGKILL) == "SIGKILL"
    unnamed = next(n for n in range(1, signal.NSIG) if n not in set(signal.Signals))
    assert signal_name(unnamed) == f"signal {unnamed}"
