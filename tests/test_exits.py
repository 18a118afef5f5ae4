"""Exit statuses decoded once: signals, SIGKILL's usual cause, signals seen through a shell."""

from __future__ import annotations

import signal

import pytest

from asyncsoak._process._exits import decode, describe, signal_name


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


def test_the_words_name_the_signal_and_its_usual_cause() -> None:
    """The description names the signal, says SIGKILL is often the OOM killer, and reads a
    shell's 128+N as probably signal N."""
    assert describe(-9) == "killed by signal 9 (SIGKILL; often the out-of-memory killer)"
    assert describe(-15) == "killed by signal 15 (SIGTERM)"
    assert describe(137) == "exit status 137 (probably signal 9, SIGKILL, via a shell)"
    assert describe(1) == "exit status 1"
    assert describe(None) == "exit status unknown (outcome lost)"


def test_an_unnamed_signal_is_given_by_number() -> None:
    """A signal number without a name (a real-time signal) is still said."""
    assert signal_name(signal.SIGKILL) == "SIGKILL"
    unnamed = next(n for n in range(1, signal.NSIG) if n not in set(signal.Signals))
    assert signal_name(unnamed) == f"signal {unnamed}"
