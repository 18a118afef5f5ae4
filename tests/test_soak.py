"""run_soak with real children: every rule, the stop sequence, cancellation, the artifact."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator

import asyncsoak
import asyncsoak._sampling
from asyncsoak import SoakControl, SoakFailureError, run_soak

from .conftest import ReadyFifo, alive, assert_valid, fast_limits, journal, py
from .gpu_support import install_fake_nvidia_smi

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

# Child snippets.  A child is told where to write through argv: progress dir, then the FIFO.
PRELUDE = """
import os, pathlib, signal, sys, time
progress = pathlib.Path(sys.argv[1])
fifo = sys.argv[2] if len(sys.argv) > 2 else None
def touch(name="metrics.txt"):
    progress.mkdir(parents=True, exist_ok=True)
    with open(progress / name, "a") as f:
        f.write("step\\n")
def say(text):
    with open(fifo, "w") as f:
        f.write(text + "\\n")
"""


def child(tmp_path: Path, body: str, fifo: ReadyFifo | None = None) -> list[str]:
    argv = py(PRELUDE + body)
    argv.append(str(tmp_path / "progress"))
    if fifo is not None:
        argv.append(str(fifo.path))
    return argv


async def soak_failure(**kwargs: Any) -> SoakFailureError:
    with anyio.fail_after(60):
        with pytest.raises(SoakFailureError) as info:
            await run_soak(**kwargs)
    return info.value


async def test_passing_soak_writes_a_valid_private_artifact(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """A child that makes progress and exits 0 passes; artifact, journal and log are private."""
    command = child(tmp_path, "for i in range(5):\n    touch(); print('step', i); time.sleep(0.1)")
    with anyio.fail_after(60):
        artifact = await run_soak(command=command, **fast_limits(tmp_path))
    assert artifact["status"] == "passed"
    assert artifact["failures"] == []
    assert artifact["exit"]["returncode"] == 0
    assert artifact["progress"]["changes"] >= 1
    assert artifact["progress"]["first_change_at"] is not None
    assert "step 4" in artifact["log"]["tail"]
    assert_valid(artifact, schema)
    out = tmp_path / "out"
    on_disk = json.loads((out / "soak.json").read_text())
    assert on_disk == json.loads(json.dumps(artifact))
    for name in ("soak.json", "soak.jsonl", "soak.log"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name


async def test_journal_has_every_event(tmp_path: Path) -> None:
    """The journal holds a header, every event of the artifact in order, and a final line."""
    command = child(tmp_path, "touch(); time.sleep(0.3); touch(); time.sleep(0.3)")
    with anyio.fail_after(60):
        artifact = await run_soak(command=command, **fast_limits(tmp_path))
    lines = journal(tmp_path / "out" / "soak.jsonl")
    assert lines[0]["kind"] == "header"
    assert lines[-1] == {"t": lines[-1]["t"], "kind": "finished", "status": "passed"}
    [snapshot] = [e for e in lines if e["kind"] == "snapshot"]
    assert snapshot["data"] == artifact["snapshot"]
    # Samples and the snapshot have their own sections in the artifact; the rest are events.
    kept = [e for e in lines[1:] if e["kind"] not in ("sample", "gpu_sample", "snapshot")]
    assert kept == artifact["events"]
    kinds = [e["kind"] for e in kept]
    assert kinds[0] == "started"
    assert {"progress", "exited", "tree_gone", "finished"} <= set(kinds)


async def test_missing_executable_is_spawn_failed(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """A command that cannot start fails the soak with spawn_failed and still writes an artifact."""
    error = await soak_failure(command=["/nonexistent/trainer"], **fast_limits(tmp_path))
    assert error.reason == "spawn_failed"
    assert "No such file" in error.failures[0]["message"]
    assert error.artifact["status"] == "failed"
    assert error.artifact_path == tmp_path / "out" / "soak.json"
    assert_valid(json.loads(error.artifact_path.read_text()), schema)


async def test_no_progress_is_startup_timeout(tmp_path: Path, schema: Draft202012Validator) -> None:
    """A child that never writes to the progress dir fails with startup_timeout, then is stopped."""
    command = child(tmp_path, "time.sleep(60)")
    error = await soak_failure(
        command=command, **fast_limits(tmp_path, startup_timeout_seconds=0.5)
    )
    assert error.reason == "startup_timeout"
    assert error.artifact["exit"]["signal"] == "SIGTERM"
    assert error.artifact["stop"]["cause"] == "failure"
    assert_valid(error.artifact, schema)


async def test_stall_is_stale_progress(tmp_path: Path) -> None:
    """Progress then silence fails with stale_progress soon after the deadline, not a tick later."""
    command = child(tmp_path, "touch(); time.sleep(60)")
    error = await soak_failure(
        command=command,
        **fast_limits(tmp_path, stale_progress_seconds=0.5, sample_interval_seconds=5.0),
    )
    assert error.reason == "stale_progress"
    events = error.artifact["events"]
    progress_t = next(e["t"] for e in events if e["kind"] == "progress")
    failure_t = next(e["t"] for e in events if e["kind"] == "failure")
    # The watchdog sleeps until the deadline: detection does not wait for the 5 s tick.
    assert 0.5 <= failure_t - progress_t < 4.0


async def test_changes_are_dated_when_they_happen_not_at_the_next_scan(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """With scans 30 s apart, a stall is still caught right after last write + stale limit."""
    body = """
touch(); time.sleep(0.2)
(progress / "deeper").mkdir(); touch("deeper/more.txt"); time.sleep(0.2)
# Stamped before the last write: the monitor dates the write when it sees it, which is after
# this stamp; a stamp taken after the write could come later than that date.
stamp = time.monotonic()
touch()
say(repr(stamp))
time.sleep(60)
"""
    error = await soak_failure(
        command=child(tmp_path, body, ready),
        **fast_limits(tmp_path, sample_interval_seconds=30.0, stale_progress_seconds=0.5),
    )
    last_write = float(await ready.line())
    failure_t = next(e["t"] for e in error.artifact["events"] if e["kind"] == "failure")
    detected = error.artifact["monitor"]["monotonic_start"] + failure_t
    assert error.reason == "stale_progress"
    assert 0.5 <= detected - last_write < 2.0
    assert error.artifact["progress"]["changes"] >= 3


async def test_with_scans_a_second_apart_a_write_is_dated_when_written(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """Scans every 0.8 s, the trainer's writes not listened to between them (they would wake
    the monitor at each): the change the next scan finds is dated by its file's mtime, when
    it was written, not when the scan came."""
    body = """
time.sleep(0.3)
stamp = time.monotonic()
touch()
say(repr(stamp))
time.sleep(60)
"""
    error = await soak_failure(
        command=child(tmp_path, body, ready),
        **fast_limits(tmp_path, sample_interval_seconds=0.8, stale_progress_seconds=2.0),
    )
    written = float(await ready.line())
    start = error.artifact["monitor"]["monotonic_start"]
    progress = [e for e in error.artifact["events"] if e["kind"] == "progress"]
    dated = start + progress[-1]["t"]
    assert -0.002 <= dated - written < 0.1
    failure_t = next(e["t"] for e in error.artifact["events"] if e["kind"] == "failure")
    assert 2.0 <= start + failure_t - written < 3.0


async def test_growth_of_a_file_present_at_start_counts(tmp_path: Path) -> None:
    """A resumed run that appends to an existing metrics file makes progress."""
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "metrics.txt").write_text("old run\n")
    command = child(tmp_path, "for _ in range(6):\n    touch(); time.sleep(0.1)")
    with anyio.fail_after(60):
        artifact = await run_soak(command=command, **fast_limits(tmp_path))
    assert artifact["progress"]["changes"] >= 1
    assert artifact["warnings"] == []


async def test_stall_with_own_files_in_progress_dir_still_goes_stale(tmp_path: Path) -> None:
    """The artifact, journal and a growing log inside progress_dir never count as progress."""
    progress = tmp_path / "progress"
    command = child(
        tmp_path, "touch()\nwhile True:\n    print('still here', flush=True); time.sleep(0.05)"
    )
    error = await soak_failure(
        command=command,
        **fast_limits(tmp_path, output_path=progress / "soak.json", stale_progress_seconds=0.6),
    )
    assert error.reason == "stale_progress"
    assert (progress / "soak.jsonl").exists()
    assert "still here" in (progress / "soak.log").read_text()


async def test_output_counts_as_progress_only_when_asked(tmp_path: Path) -> None:
    """A trainer whose only sign of life is its output passes with output_is_progress."""
    body = "for i in range(30):\n    print('loss', i, flush=True); time.sleep(0.1)"
    limits = fast_limits(tmp_path, startup_timeout_seconds=2.0)
    with anyio.fail_after(60):
        artifact = await run_soak(command=child(tmp_path, body), output_is_progress=True, **limits)
    assert artifact["status"] == "passed"
    assert artifact["progress"]["changes"] >= 1
    error = await soak_failure(
        command=child(tmp_path, body), **fast_limits(tmp_path, startup_timeout_seconds=2.0)
    )
    assert error.reason == "startup_timeout"


async def test_nonzero_exit(tmp_path: Path) -> None:
    """A command exiting with a non-zero status fails with nonzero_exit."""
    error = await soak_failure(
        command=child(tmp_path, "touch(); sys.exit(3)"), **fast_limits(tmp_path)
    )
    assert error.reason == "nonzero_exit"
    assert error.artifact["exit"]["returncode"] == 3


async def test_killed_by_a_foreign_signal_is_signaled(tmp_path: Path) -> None:
    """A command killed by a signal the monitor did not send fails with signaled."""
    error = await soak_failure(
        command=child(tmp_path, "touch(); os.kill(os.getpid(), signal.SIGKILL)"),
        **fast_limits(tmp_path),
    )
    assert error.reason == "signaled"
    assert error.artifact["exit"] == {
        "returncode": -9,
        "signal": "SIGKILL",
        "pid": error.artifact["exit"]["pid"],
        "exception": None,
    }


async def test_ending_before_min_duration_is_too_short(tmp_path: Path) -> None:
    """A clean exit before min_duration_seconds fails with too_short."""
    error = await soak_failure(
        command=child(tmp_path, "touch()"), **fast_limits(tmp_path, min_duration_seconds=30)
    )
    assert error.reason == "too_short"
    assert error.artifact["exit"]["returncode"] == 0


async def test_several_reasons_are_all_listed(tmp_path: Path, ready: ReadyFifo) -> None:
    """nonzero_exit and leftover_processes hold together; the first is primary."""
    body = """
touch()
if os.fork() == 0:
    os.setsid()
    say(str(os.getpid()))
    time.sleep(60)
    os._exit(0)
sys.exit(2)
"""
    error = await soak_failure(
        command=child(tmp_path, body, ready),
        **fast_limits(tmp_path, post_shutdown_grace_seconds=0.3),
    )
    assert [f["reason"] for f in error.failures] == ["nonzero_exit", "leftover_processes"]
    assert error.reason == "nonzero_exit"


async def test_daemonised_leftover_is_reported_and_killed(
    tmp_path: Path, ready: ReadyFifo, schema: Draft202012Validator
) -> None:
    """A double-forked, setsid grandchild outliving the command is found, reported and killed."""
    body = """
touch()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        say(str(os.getpid()))
        time.sleep(60)
    os._exit(0)
time.sleep(0.2)
"""
    error = await soak_failure(
        command=child(tmp_path, body, ready),
        **fast_limits(tmp_path, post_shutdown_grace_seconds=0.3),
    )
    daemon = int(await ready.line())
    assert error.reason == "leftover_processes"
    [leftover] = error.artifact["leftover_processes"]
    assert leftover["pid"] == daemon
    assert leftover["left_group"] == "left the command's session (setsid / daemonised)"
    assert not alive(daemon)
    assert_valid(error.artifact, schema)


async def test_sigterm_ignoring_child_is_killed_after_the_grace(tmp_path: Path) -> None:
    """A stalled child that ignores SIGTERM gets SIGKILL once post_shutdown_grace_seconds pass."""
    body = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntouch()\ntime.sleep(60)"
    error = await soak_failure(
        command=child(tmp_path, body),
        **fast_limits(tmp_path, stale_progress_seconds=0.3, post_shutdown_grace_seconds=0.5),
    )
    stop = error.artifact["stop"]
    assert [s["signal"] for s in stop["signals"]] == ["SIGTERM", "SIGKILL"]
    assert stop["killed"] is True
    # The SIGKILL waited out the whole grace after the SIGTERM.  Event times are kept to the
    # microsecond, so two instants exactly a grace apart may read a hair under it: the
    # comparison allows that rounding, not any lateness of the SIGTERM.
    term, kill = (s["t"] for s in stop["signals"])
    assert stop["grace_seconds"] == 0.5
    assert kill - term >= stop["grace_seconds"] - 1e-5
    assert error.artifact["exit"]["signal"] == "SIGKILL"
    assert error.reason == "stale_progress"
    assert not alive(error.artifact["exit"]["pid"])


async def test_chatty_child_neither_blocks_nor_bloats(tmp_path: Path) -> None:
    """Megabytes of output are capped in the log (head and tail kept) and never block the child."""
    body = """
touch()
chunk = ("x" * 1023 + "\\n") * 64
for _ in range(40 * 16):
    sys.stdout.write(chunk)
sys.stdout.write("THE END\\n")
sys.stdout.flush()
touch()
"""
    cap = 256 * 1024
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=child(tmp_path, body), log_max_bytes=cap, **fast_limits(tmp_path)
        )
    assert artifact["status"] == "passed"
    log = tmp_path / "out" / "soak.log"
    assert log.stat().st_size <= cap + 100
    text = log.read_text()
    assert "bytes of output omitted" in text
    assert text.endswith("THE END\n")
    assert artifact["log"]["tail"].endswith("THE END\n")


async def test_outer_cancellation_stops_the_tree_and_writes_cancelled(
    tmp_path: Path, ready: ReadyFifo, schema: Draft202012Validator
) -> None:
    """Cancelling from an outer scope leaves no process alive and writes a cancelled artifact."""
    body = """
touch()
worker = os.fork()
if worker == 0:
    time.sleep(60)
    os._exit(0)
say(f"{os.getpid()} {worker}")
time.sleep(60)
"""
    pids: list[int] = []
    with anyio.fail_after(60):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_when_ready() -> None:
                    pids.extend(map(int, (await ready.line()).split()))
                    scope.cancel()

                tg.start_soon(cancel_when_ready)
                await run_soak(command=child(tmp_path, body, ready), **fast_limits(tmp_path))
    assert scope.cancelled_caught
    artifact = json.loads((tmp_path / "out" / "soak.json").read_text())
    assert artifact["status"] == "cancelled"
    assert artifact["stop"]["cause"] == "cancelled"
    assert artifact["failures"] == []
    assert_valid(artifact, schema)
    assert len(pids) == 2
    assert not any(alive(pid) for pid in pids)


async def test_asyncio_task_cancel_propagates_after_cleanup(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """asyncio's own task.cancel() stops the tree, writes the artifact and raises CancelledError."""
    body = "touch()\nsay(str(os.getpid()))\ntime.sleep(60)"
    task = asyncio.ensure_future(
        run_soak(command=child(tmp_path, body, ready), **fast_limits(tmp_path))
    )
    pid = int(await ready.line())
    task.cancel()
    with anyio.fail_after(30), pytest.raises(asyncio.CancelledError):
        await task
    assert not alive(pid)
    artifact = json.loads((tmp_path / "out" / "soak.json").read_text())
    assert artifact["status"] == "cancelled"


async def test_requested_stop_with_exit_4_is_cancelled_not_failed(
    tmp_path: Path, ready: ReadyFifo
) -> None:
    """A stop asked through SoakControl closes stdin; the trainer saves and exits 4: cancelled."""
    body = """
touch()
say("ready")
sys.stdin.read()
(progress / "checkpoint").write_text("saved")
sys.exit(4)
"""
    control = SoakControl()
    async with anyio.create_task_group() as tg:

        async def stop_when_ready() -> None:
            await ready.line()
            control.request_stop(reason="worker stopping")

        tg.start_soon(stop_when_ready)
        with anyio.fail_after(60):
            artifact = await run_soak(
                command=child(tmp_path, body, ready),
                stop_mode="stdin",
                control=control,
                **fast_limits(tmp_path),
            )
    assert artifact["status"] == "cancelled"
    assert artifact["failures"] == []
    assert artifact["exit"]["returncode"] == 4
    assert artifact["stop"] == {
        "cause": "requested",
        "mode": "stdin",
        "grace_seconds": 2.0,
        "killed": False,
        "signals": [],
    }
    assert (tmp_path / "progress" / "checkpoint").read_text() == "saved"
    assert control.pid == artifact["exit"]["pid"]
    # The run's one state, folded as the artifact was, stays readable on the control.
    assert control.state is not None
    assert control.state.exit["returncode"] == 4
    assert control.state.status == "cancelled"


async def test_max_duration_stops_and_passes(tmp_path: Path) -> None:
    """Reaching max_duration_seconds stops a healthy run, and the soak passes."""
    body = "while True:\n    touch(); time.sleep(0.05)"
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=child(tmp_path, body), max_duration_seconds=1.0, **fast_limits(tmp_path)
        )
    assert artifact["status"] == "passed"
    assert artifact["stop"]["cause"] == "max_duration"
    assert artifact["exit"]["signal"] == "SIGTERM"
    assert artifact["duration_seconds"] >= 1.0


async def test_clean_exit_without_progress_passes_with_a_warning(tmp_path: Path) -> None:
    """A command that exits 0 before its startup deadline without progress, its progress dir
    there but left empty, passes with a warning naming the directory."""
    (tmp_path / "progress").mkdir()
    with anyio.fail_after(60):
        artifact = await run_soak(command=py("pass"), **fast_limits(tmp_path))
    assert artifact["status"] == "passed"
    assert artifact["warnings"] == [
        f"the command exited cleanly without any progress in {tmp_path / 'progress'} "
        "(it exists, and nothing in it changed)"
    ]


async def test_a_progress_dir_that_never_exists_fails_no_progress(tmp_path: Path) -> None:
    """A command that exits 0 without any progress while its progress dir never exists (a
    typo'd --progress-dir) fails no_progress, naming the directory; output counted as
    progress (--output-is-progress) is progress, and passes."""
    failure = await soak_failure(command=py("pass"), **fast_limits(tmp_path))
    assert [f["reason"] for f in failure.artifact["failures"]] == ["no_progress"]
    message = failure.artifact["failures"][0]["message"]
    assert f"{tmp_path / 'progress'} never existed" in message
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=py("print('step 1')"),
            output_is_progress=True,
            **fast_limits(tmp_path / "printed"),
        )
    assert artifact["status"] == "passed"
    assert artifact["warnings"] == []


async def test_leader_stop_mode_signals_only_the_leader(tmp_path: Path) -> None:
    """With stop_mode="leader" only the command gets SIGTERM; it stops its own workers."""
    body = """
worker = os.fork()
if worker == 0:
    signal.signal(signal.SIGTERM, lambda *_: (touch("worker-got-sigterm"), os._exit(0)))
    time.sleep(60)
    os._exit(0)
def stop(*_):
    os.kill(worker, signal.SIGKILL)
    os.waitpid(worker, 0)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    touch(); time.sleep(0.05)
"""
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=child(tmp_path, body),
            stop_mode="leader",
            max_duration_seconds=0.8,
            **fast_limits(tmp_path),
        )
    assert artifact["status"] == "passed"
    assert [s["target"] for s in artifact["stop"]["signals"]] == ["leader"]
    assert not (tmp_path / "progress" / "worker-got-sigterm").exists()


async def test_monitor_error_writes_an_error_artifact_and_reraises(
    tmp_path: Path, ready: ReadyFifo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An internal failure of the monitor stops the tree, writes status error, and re-raises."""

    async def broken_watchdog(*args: Any, **kwargs: Any) -> None:
        await ready.line()
        raise RuntimeError("watchdog exploded")

    monkeypatch.setattr(asyncsoak._sampling, "run_watchdog", broken_watchdog)
    body = "say(str(os.getpid()))\ntime.sleep(60)"
    with anyio.fail_after(60), pytest.raises(RuntimeError, match="watchdog exploded"):
        await run_soak(command=child(tmp_path, body, ready), **fast_limits(tmp_path))
    artifact = json.loads((tmp_path / "out" / "soak.json").read_text())
    assert artifact["status"] == "error"
    assert artifact["failures"][0]["reason"] == "monitor_error"
    assert not alive(artifact["exit"]["pid"])


async def test_host_program_children_keep_their_exit_status(tmp_path: Path) -> None:
    """The monitor never reaps the host's own children: their exit statuses stay theirs."""
    host_child = await anyio.open_process(py("import sys; sys.stdin.read(); sys.exit(7)"))
    try:
        body = "touch()\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(0.3)"
        with anyio.fail_after(60):
            await run_soak(command=child(tmp_path, body), **fast_limits(tmp_path))
        assert host_child.stdin is not None
        await host_child.stdin.aclose()
        with anyio.fail_after(10):
            assert await host_child.wait() == 7
    finally:
        if host_child.returncode is None:
            host_child.kill()
            await host_child.wait()
        await host_child.aclose()


def _bad(tmp_path: Path, **change: Any) -> dict[str, Any]:
    kwargs = fast_limits(tmp_path)
    kwargs["command"] = py(f"open({str(tmp_path / 'launched')!r}, 'w')")
    kwargs.update(change)
    return kwargs


BAD_INPUTS: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("empty command", {"command": []}, ValueError),
    ("string command", {"command": "python train.py"}, TypeError),
    ("non-string argv item", {"command": ["python", 3]}, TypeError),
    ("negative duration", {"stale_progress_seconds": -1}, ValueError),
    ("NaN duration", {"startup_timeout_seconds": float("nan")}, ValueError),
    ("infinite duration", {"post_shutdown_grace_seconds": float("inf")}, ValueError),
    ("zero sample interval", {"sample_interval_seconds": 0}, ValueError),
    ("boolean duration", {"min_duration_seconds": True}, TypeError),
    ("metadata not JSON", {"metadata": {"when": object()}}, ValueError),
    ("env with non-string value", {"env": {"A": 1}}, TypeError),
    ("env with non-string key", {"env": {1: "a"}}, TypeError),
    ("unknown stop mode", {"stop_mode": "sigkill"}, ValueError),
    ("zero max duration", {"max_duration_seconds": 0}, ValueError),
]


@pytest.mark.parametrize(
    ("change", "error"), [(c, e) for _, c, e in BAD_INPUTS], ids=[n for n, _, _ in BAD_INPUTS]
)
async def test_bad_input_is_refused_before_anything_happens(
    tmp_path: Path, change: dict[str, Any], error: type[Exception]
) -> None:
    """Bad arguments raise a clear TypeError/ValueError; nothing is launched or written."""
    with pytest.raises(error):
        await run_soak(**_bad(tmp_path, **change))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


async def test_progress_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    """A progress_dir that exists as a file is a ValueError; nothing is written."""
    (tmp_path / "progress").write_text("not a dir")
    with pytest.raises(ValueError, match="not a directory"):
        await run_soak(**_bad(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress"]


async def test_output_path_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    """An output_path that is a directory is a ValueError; nothing is launched."""
    (tmp_path / "out.json").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        await run_soak(**_bad(tmp_path, output_path=tmp_path / "out.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    assert list((tmp_path / "out.json").iterdir()) == []


async def test_env_replaces_the_environment_and_marks_the_tree(tmp_path: Path) -> None:
    """env is the child's whole environment, plus the soak marker; secrets stay out of files."""
    # Python itself may add LC_CTYPE (PEP 538 locale coercion): ignore it.
    body = "touch()\nprint(sorted(set(os.environ) - {'LC_CTYPE'}))\nprint(os.environ['HF_TOKEN'])"
    env = {"HF_TOKEN": "hf_abcdefghijklmnop", "PATH": os.environ["PATH"]}
    with anyio.fail_after(60):
        artifact = await run_soak(command=child(tmp_path, body), env=env, **fast_limits(tmp_path))
    # The soak's marker, and where asyncsoak.trainer.report writes.
    assert (
        "['ASYNCSOAK_SOAK_ID', 'ASYNCSOAK_STEPS_FILE', 'HF_TOKEN', 'PATH']"
        in artifact["log"]["tail"]
    )
    assert "hf_abcdefghijklmnop" not in artifact["log"]["tail"]
    for name in ("soak.json", "soak.jsonl"):
        assert "hf_abcdefghijklmnop" not in (tmp_path / "out" / name).read_text()


async def test_cwd_is_the_childs_working_directory(tmp_path: Path) -> None:
    """cwd sets where the command runs; relative paths of the call stay the caller's."""
    work = tmp_path / "work"
    work.mkdir()
    body = "touch()\nprint('cwd=' + os.getcwd())"
    with anyio.fail_after(60):
        artifact = await run_soak(command=child(tmp_path, body), cwd=work, **fast_limits(tmp_path))
    assert f"cwd={work}" in artifact["log"]["tail"]
    assert artifact["cwd"] == str(work)


async def test_whole_tree_is_sampled(tmp_path: Path, schema: Draft202012Validator) -> None:
    """A tree of 25 processes is counted whole, and its memory adds up in the tree totals."""
    body = """
touch()
workers = []
for _ in range(24):
    pid = os.fork()
    if pid == 0:
        ballast = bytearray(4 * 2**20)
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1
        time.sleep(60)
        os._exit(0)
    workers.append(pid)
for _ in range(15):
    touch(); time.sleep(0.1)
for pid in workers:
    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)
"""
    with anyio.fail_after(60):
        artifact: Mapping[str, Any] = await run_soak(
            command=child(tmp_path, body), **fast_limits(tmp_path)
        )
    tree = artifact["summary"]["tree"]
    assert tree["processes"]["max"] == 25
    assert tree["rss_bytes"]["max"] >= 24 * 4 * 2**20
    assert artifact["summary"]["samples"]["sample"] >= 5
    assert max(artifact["series"]["tree"]["processes"]) == 25
    assert "memory_percent" in artifact["series"]["machine"]
    assert_valid(artifact, schema)
    samples = [e for e in journal(tmp_path / "out" / "soak.jsonl") if e["kind"] == "sample"]
    assert max(len(s["processes"]) for s in samples) == 25


async def test_gpu_series_and_the_matched_process(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """nvidia-smi replaying the H200 load capture: GPU series and the child's GPU memory show."""
    pid_file = tmp_path / "gpu-pid"
    fake = install_fake_nvidia_smi(tmp_path, "load", pid_file=pid_file)
    body = f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n" + (
        "for _ in range(20):\n    touch(); time.sleep(0.1)"
    )
    with anyio.fail_after(60):
        artifact = await run_soak(
            command=child(tmp_path, body),
            **fast_limits(tmp_path, nvidia_smi=str(fake.path)),
        )
    assert_valid(artifact, schema)
    gpu = artifact["summary"]["gpu0"]
    assert gpu["utilization_gpu_percent"]["max"] == 99
    assert gpu["power_draw_w"]["max"] == pytest.approx(690.94)
    assert gpu["throttle_reasons"] == ["sw_power_cap"]
    assert artifact["summary"]["gpu_tree"]["tree_gpu_memory_mib"]["max"] == 21354
    assert len(artifact["series"]["gpu0"]["t"]) >= 3
    samples = [e for e in journal(tmp_path / "out" / "soak.jsonl") if e["kind"] == "gpu_sample"]
    matched = [p for s in samples for p in s["processes"] or [] if p.get("in_tree")]
    assert matched
    assert matched[0]["pid"] == artifact["exit"]["pid"]


async def test_hung_nvidia_smi_degrades_only_the_gpu_sampler(tmp_path: Path) -> None:
    """A hung nvidia-smi marks the GPU sampler degraded; the soak's verdict and stop are on time."""
    fake = install_fake_nvidia_smi(tmp_path, "hang")
    body = "touch()\ntime.sleep(60)"
    started = anyio.current_time()
    error = await soak_failure(
        command=child(tmp_path, body),
        **fast_limits(tmp_path, nvidia_smi=str(fake.path), stale_progress_seconds=3.0),
    )
    assert error.reason == "stale_progress"
    assert anyio.current_time() - started < 20
    kinds = [e["kind"] for e in error.artifact["events"]]
    assert "sampler_degraded" in kinds
    assert error.artifact["summary"]["samples"]["sample"] >= 3
    assert fake.loops() or fake.calls()
    assert not any(alive(i["pid"]) for i in fake.invocations())


async def test_a_steady_soak_makes_a_few_thread_hops_per_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once running, each tick costs a few calls on asyncsoak's pool (the /proc read, the
    scan of the progress dir, the journal's batch), never a growing number: no call per
    event, no thread of its own."""
    from asyncsoak._contract import _blocking

    calls: list[str] = []
    submit = _blocking.EXECUTOR.submit

    def counting(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__qualname__", type(fn).__name__))
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(_blocking.EXECUTOR, "submit", counting)
    threads_before = {t.name for t in threading.enumerate()}
    command = child(tmp_path, "for i in range(50):\n    touch(); time.sleep(0.1)")
    with anyio.fail_after(60):
        artifact = await run_soak(command=command, **fast_limits(tmp_path))
    samples = artifact["monitor"]["samples"]["sample"]
    assert samples >= 30
    assert {t.name for t in threading.enumerate()} - threads_before <= {"asyncsoak-blocking"}
    assert len(calls) < 4 * samples + 30, Counter(calls)
