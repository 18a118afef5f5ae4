"""The soak's producers: the progress dir's watch set up, the spawner's watch, the watchdog and
the samplers started (each with its own clone of the sink), and the last scan after the exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from anyio.abc import TaskGroup

from .._contract import BlockingCallTimeout, EventSink, FailureReason, run_blocking
from .._process import Spawner
from .._record import RunState
from .._sampling import (
    KeyChoice,
    ProgressTracker,
    ScanResult,
    StaleLimit,
    StepReader,
    StepTracker,
    final_scan,
    scan_progress_dir,
)
from ._outputs import SoakFiles
from ._stop import TreeStop, produce

#: Bound on the scan of the progress dir once the command has exited.
FINAL_SCAN_TIMEOUT_SECONDS = 10.0
#: Bound on the scan of the progress dir taken before the start (its baseline).
BASELINE_TIMEOUT_SECONDS = 60.0


@dataclass
class ProgressWatch:
    """How the progress dir is watched, by the watchdog and by the final scan."""

    tracker: ProgressTracker
    #: The training steps' reader; None when only file changes count.
    steps: StepReader | None
    #: The soak's own files and the excluded directories, as (device, inode).
    ignore: set[tuple[int, int]]
    #: Watched by path besides the dir: the log, when its output counts as progress.
    also: list[Path]


def import_samplers() -> None:
    """Import the samplers' modules (blocking): a soak does it in a thread while its command
    starts, when the monitor only waits."""
    from .._sampling import find_nvidia_smi, run_proc_sampler, run_watchdog  # noqa: F401


class Producers:
    """The soak's producers and the progress watch they share."""

    def __init__(
        self, tree_stop: TreeStop, state: RunState, *, host_ended: Callable[[], bool]
    ) -> None:
        self.cfg = tree_stop.cfg
        self._tree_stop = tree_stop
        self._state = state
        self._host_ended = host_ended

    def own_files(self, files: SoakFiles) -> set[tuple[int, int]]:
        """What the progress scans skip, as (device, inode): the journal, the log unless its
        output is progress, the excluded directories."""
        keys = {os.fstat(files.journal_fd)}
        if not self.cfg.output_is_progress:
            keys.add(os.fstat(files.log_fd))
        for path in self.cfg.progress_exclude:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                if stat.S_ISDIR(st.st_mode):
                    keys.add(st)
        return {(st.st_dev, st.st_ino) for st in keys}

    def also_watched(self) -> list[Path]:
        """Watched by path besides the progress dir: the log may live outside it."""
        return [self.cfg.log_path] if self.cfg.output_is_progress else []

    async def scan_baseline(self, ignore: set[tuple[int, int]]) -> tuple[ScanResult, str | None]:
        """The progress dir before the start, and why it is empty when the scan timed out."""
        cfg = self.cfg
        try:
            with self._tree_stop.given_up_on_caller_stop():
                try:
                    return await run_blocking(
                        partial(scan_progress_dir, cfg.progress_dir, ignore, self.also_watched()),
                        timeout=BASELINE_TIMEOUT_SECONDS,
                        what=f"the first scan of {cfg.progress_dir}",
                        limiter=self._tree_stop.limiter,
                    ), None
                except BlockingCallTimeout as exc:
                    # Every file will then count as new: the watchdog's bounded scans decide.
                    return ScanResult(files={}), str(exc)
        except asyncio.CancelledError:
            # Outside the scope: the caller's stop may have cancelled it at the same instant.
            if not self._host_ended():
                raise
        # The caller stopped the soak during the scan, or the host's loop ended.
        return ScanResult(files={}), None

    def step_reader(self, baseline: ScanResult) -> StepReader | None:
        """The training steps' reader, unless only file changes count as progress."""
        cfg = self.cfg
        if cfg.progress_source == "files":
            return None
        # A file an earlier soak over the same output left (check_outputs made sure).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cfg.steps_path)
        return StepReader(
            cfg.progress_dir,
            keys=KeyChoice(cfg.step_key, cfg.loss_key),
            report_file=cfg.steps_path,
            baseline={name: state.size for name, state in baseline.files.items()},
        )

    def watch(
        self, baseline: ScanResult, steps: StepReader | None, ignore: set[tuple[int, int]]
    ) -> ProgressWatch:
        """The progress dir's watch, from its baseline on."""
        cfg = self.cfg
        stale, startup = cfg.stale_progress_seconds, cfg.startup_timeout_seconds
        auto = StaleLimit(startup_limit=startup, carried=cfg.stale_progress_carried_seconds)
        step_tracker = StepTracker(loss_check=cfg.loss_check, step_key=cfg.step_key)
        tracker = ProgressTracker(
            baseline.files,
            startup_timeout=startup,
            stale_after=startup if stale == "auto" else stale,
            auto=auto if stale == "auto" else None,
            steps=None if steps is None else step_tracker,
            source=cfg.progress_source,
        )
        tracker.skipped_dirs = baseline.errors
        tracker.named_globs = (*(cfg.expect_every or ()), *cfg.checkpoint_globs)
        return ProgressWatch(tracker, steps, ignore, self.also_watched())

    def start(
        self, producers: TaskGroup, sink: EventSink, spawner: Spawner, watch: ProgressWatch
    ) -> None:
        """The spawner's watch, the watchdog and the samplers (their modules imported here:
        :func:`import_samplers` has them ready while the command starts)."""
        from .._sampling import run_proc_sampler, run_watchdog

        cfg, limiter = self.cfg, self._tree_stop.limiter
        assert spawner.reaper_pid is not None
        produce(producers, sink, spawner.watch)
        watchdog = partial(
            run_watchdog,
            progress_dir=cfg.progress_dir,
            tracker=watch.tracker,
            ignore=lambda: watch.ignore,
            also=watch.also,
            scan_interval=cfg.sample_interval_seconds,
            limiter=limiter,
            steps=watch.steps,
        )
        produce(producers, sink, watchdog)
        proc_sampler = partial(
            run_proc_sampler,
            root_pid=spawner.reaper_pid,
            interval=cfg.sample_interval_seconds,
            disk_paths={"progress": cfg.progress_dir, "output": cfg.output_path.parent},
            detailed_memory=cfg.detailed_memory,
            masker=self._tree_stop.masker,
            members_file=None if spawner.cgroup is None else spawner.cgroup.procs_file,
            tree_gone=spawner.tree_gone,
        )
        produce(producers, sink, proc_sampler)
        if cfg.nvidia_smi is not None:
            produce(producers, sink, self._sample_gpus)

    async def _sample_gpus(self, sink: EventSink) -> None:
        """The GPU sampler, its modules imported only once ``nvidia-smi`` is found."""
        cfg, limiter = self.cfg, self._tree_stop.limiter
        assert cfg.nvidia_smi is not None
        # nvidia-smi answers in tens of milliseconds: silent for a few periods, it is degraded.
        call_timeout = min(10.0, max(2.0, 4 * cfg.sample_interval_seconds))
        from .._sampling import find_nvidia_smi

        found = await find_nvidia_smi(
            sink, cfg.nvidia_smi, call_timeout=call_timeout, limiter=limiter
        )
        if found is None:
            return
        from .._sampling import run_gpu_sampler

        await run_gpu_sampler(
            sink,
            interval=cfg.sample_interval_seconds,
            tree_pids=lambda: self._state.tree_pids,
            nvidia_smi=found,
            call_timeout=call_timeout,
            limiter=limiter,
            visible_devices=(os.environ if cfg.env is None else cfg.env).get(
                "CUDA_VISIBLE_DEVICES"
            ),
        )

    async def last_scan(self, sink: EventSink, watch: ProgressWatch) -> None:
        """A command shorter than one scan interval: what it wrote still counts."""
        broken = await final_scan(
            sink,
            progress_dir=self.cfg.progress_dir,
            tracker=watch.tracker,
            ignore=watch.ignore,
            also=watch.also,
            limiter=self._tree_stop.limiter,
            scan_timeout=FINAL_SCAN_TIMEOUT_SECONDS,
            steps=watch.steps,
        )
        if broken is not None:  # the loss went NaN in the last steps
            reason, message = broken
            await self._tree_stop.fail(FailureReason(reason), message)
