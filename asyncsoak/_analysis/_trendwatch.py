"""What the trend rules and the artifact's ``trends`` and ``processes`` need, folded from events.

:class:`TrendWatch` lives inside the artifact builder, so the same fold runs live (the soak's
rules read it) and offline (``asyncsoak recover`` rebuilds the same ``trends`` from a journal).
Everything it keeps is bounded however long the soak runs: each series is a
:class:`~asyncsoak._contract._series.SeriesBuffer` of window *minima* (free disk: maxima), which
is all the estimator looks at, and at most ``MAX_TRACKED_PROCESSES`` processes are followed.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._contract import (
    MEMORY_CGROUP_LIMITS,
    GpuSampleJson,
    LimitsJson,
    ProgressJson,
    SampleJson,
    SeriesBuffer,
    TrendJson,
)
from .._process import RoleFold
from ._activity import GpuActivity, stall_activity
from ._trends import (
    FLOORS,
    RECENT_FRACTIONS,
    WARM_UP_MAX_SECONDS,
    Direction,
    Trend,
    default_warm_up,
    describe_growth,
    estimate_trend,
    format_amount,
    median,
    progress_slowing,
)

MiB = 2**20
#: Points kept per series for the estimator (window minima of the samples).
TRACK_POINTS = 256
#: Points per process in the artifact's ``processes`` series.
PROCESS_POINTS = 200
#: Processes followed at most (a run that spawns a worker per step must not grow the monitor).
MAX_TRACKED_PROCESSES = 64
#: Stragglers: a rank whose progress files grow at less than STRAGGLER_RATIO of the median
#: rank's rate, measured over a window of STRAGGLER_INTERVALS sample intervals (at least
#: STRAGGLER_MIN_SECONDS), and for a whole window more, is called a straggler.
STRAGGLER_RATIO = 0.5
STRAGGLER_INTERVALS = 20
STRAGGLER_MIN_SECONDS = 2.0
#: Ranks whose own progress is followed at most.
MAX_RANK_SERIES = 1024
#: Processes in the artifact's ``processes`` (the top ones by peak RSS).
TOP_PROCESSES = 8
#: Processes whose own memory trend is judged (the top ones by peak RSS).
JUDGED_PROCESSES = 8
#: A process is judged when it lived through this fraction of the analysed span, or through
#: its recent part (the smallest of the estimator's recent fractions) to the end of it, give
#: or take ``ALIVE_AT_END_INTERVALS`` samples.
PROCESS_COVERAGE = 0.8
ALIVE_AT_END_INTERVALS = 3
#: During the run, the warm-up is at least this many sample intervals (at most
#: ``WARM_UP_MAX_SECONDS``): a warm-up ramp (a caching allocator, a data loader's prefetch)
#: rises exactly like a leak until it ends, and under ``leak_check="fail"`` the run is
#: stopped at the first live call, so the live judgement waits out a ramp this long.
LIVE_WARM_UP_INTERVALS = 60
#: Left out of the final judgement: the shutdown before the end (samples, or seconds).
SHUTDOWN_SAMPLES = 2
SHUTDOWN_SECONDS = 0.5
#: Progress-rate buckets: this many sample intervals, within these bounds (seconds).
RATE_BUCKET_INTERVALS = 5
RATE_BUCKET_BOUNDS = (0.5, 60.0)
#: What a stalled tree was doing is judged (``_activity``) on the mean of its last this many
#: samples.
ACTIVITY_SAMPLES = 10
#: The tree's judged memory, by preference (the first the sample has), with what it measures:
#: anonymous + shared memory, counted once (PSS, ``--detailed-memory``) or per process; RSS
#: in journals written before the sampler read it.
TREE_MEMORY_SERIES = (
    ("tree.anon_pss_bytes", "anonymous + shared, PSS"),
    ("tree.anon_bytes", "anonymous + shared"),
    ("tree.pss_bytes", "PSS"),
    ("tree.rss_bytes", "RSS"),
)
#: Keys of the series that machine or cgroup memory limits.
MEMORY_SUFFIXES = (".anon_bytes", ".anon_pss_bytes", ".rss_bytes", ".pss_bytes", "shm_used_bytes")
#: Once the tree is gone, a GPU it used holding this much more than at the start (or this
#: share of its memory, whichever is larger) did not get its memory back.
GPU_RELEASE_FLOOR_BYTES = 256 * MiB
GPU_RELEASE_FLOOR_RATIO = 0.02
#: A GPU reading tells what the tree left only this long (plus a sample interval) after the
#: tree was gone: the GPU sampler's process list may be that old (``APPS_SLACK``, 0.5 s).
GPU_SETTLE_SECONDS = 1.0
#: Growth floors of series in "per_minute" (the progress rate is judged by progress_slowing).
SERIES_UNITS = {"bytes": FLOORS["bytes"], "count": FLOORS["count"]}


#: A recent reading of :meth:`TrendWatch.stalled` (a figure, a flag, a GPU's readings).
_Reading = TypeVar("_Reading")


@dataclass(slots=True)
class Track:
    """One judged series: its floors over time and how to name it."""

    unit: str
    label: str
    direction: Direction = "up"
    pid: int | None = None
    name: str | None = None
    floors: SeriesBuffer = field(default_factory=lambda: SeriesBuffer(TRACK_POINTS, keep="min"))
    last: float | None = None

    def add(self, t: float, value: float | None) -> None:
        if value is None:
            return
        self.floors.add(t, {"v": value})
        self.last = value


@dataclass(slots=True)
class ProcessRecord:
    pid: int
    name: str
    first_t: float
    last_t: float
    first_rss: int
    peak_rss: int
    last_rss: int
    #: Anonymous + shared memory (what is judged), at its peak.
    peak_anon: int = 0
    cpu_total: float = 0.0
    cpu_count: int = 0
    peak_threads: int = 0
    peak_gpu: int | None = None
    gpu_now: int | None = None
    series: SeriesBuffer = field(default_factory=lambda: SeriesBuffer(PROCESS_POINTS))
    #: The judged memory (anonymous + shared; RSS in older journals) and its key's last
    #: part (``anon_bytes``, ``rss_bytes``).
    rss: Track | None = None
    memory_key: str = "anon_bytes"
    gpu: Track | None = None
    #: Its part in a distributed run (a rank, a launcher), as the sampler read it.
    role: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "name": self.name,
            "first_rss_bytes": self.first_rss,
            "peak_rss_bytes": self.peak_rss,
            "last_rss_bytes": self.last_rss,
            "peak_anon_bytes": self.peak_anon,
            "mean_cpu_percent": (
                round(self.cpu_total / self.cpu_count, 2) if self.cpu_count else None
            ),
            "peak_gpu_memory_bytes": self.peak_gpu,
            "peak_threads": self.peak_threads,
            "first_t": round(self.first_t, 3),
            "last_t": round(self.last_t, 3),
            "series": self.series.to_json(),
            "role": self.role,
        }


@dataclass(frozen=True, slots=True)
class Budgets:
    """The caller's budgets (None: no budget) and what projections are judged against."""

    max_rss_bytes: int | None = None
    max_gpu_memory_bytes: int | None = None
    min_disk_free_bytes: int | None = None


class TrendWatch:
    """Folds samples, GPU samples, progress and limits into bounded trend state."""

    def __init__(self) -> None:
        self.tracks: dict[str, Track] = {}
        self.processes: dict[int, ProcessRecord] = {}
        self.processes_not_followed = 0
        #: The sample time at which no tracked process could be evicted (all were alive).
        self._no_room_at: float | None = None
        self.limits: dict[str, Any] = {
            "memory_total_bytes": None,
            "cgroup_memory_max_bytes": None,
            "disk_total_bytes": {},
            **dict.fromkeys(MEMORY_CGROUP_LIMITS),
        }
        #: Per GPU index: total memory in bytes.
        self.gpu_total: dict[int, int] = {}
        #: What the GPUs say of the tree's memory once it is gone (see :meth:`gpu_not_released`):
        #: each GPU's used memory at the first GPU sample, the GPUs and pids of the tree that
        #: held GPU memory, when the tree was gone, and the first GPU sample after that.
        self.gpu_used_at_start: dict[int, int] = {}
        self.gpus_of_tree: set[int] = set()
        self.gpu_pids_of_tree: dict[int, str] = {}
        self.tree_gone_t: float | None = None
        self.gpu_after_tree: GpuSampleJson | None = None
        self.interval: float | None = None
        self.detailed_memory = False
        self.warm_up_seconds: float | None = None
        self.budgets = Budgets()
        self.first_t: float | None = None
        self.last_t = 0.0
        self.end_t: float | None = None
        # The newest figures, for the budgets and the stall message.
        #: (what is measured, bytes) of the tree's memory that can run out.
        self.tree_memory: tuple[str, int] | None = None
        self.tree_gpu_bytes: int | None = None
        self.disk_free: dict[str, tuple[str, int]] = {}  # label -> (path, free bytes)
        #: (when, figure) of the last samples, judged by :meth:`activity`.
        self.recent_cpu: deque[tuple[float, float]] = deque(maxlen=ACTIVITY_SAMPLES)
        #: Whose CPU ``recent_cpu`` is: the ranks' once the tree has ranks (a launcher polls
        #: its ranks and is busy or idle whatever they do), the whole tree's otherwise.
        self.cpu_of = "tree"
        #: The role (a rank, a launcher) of each process of the tree that has one.
        self.role_fold = RoleFold()
        #: rank -> (when, bytes its progress files grew by), over the last straggler window.
        self.rank_progress: dict[str, deque[tuple[float, int]]] = {}
        #: rank -> since when it has been behind; and the stragglers found, by rank.
        self._behind_since: dict[str, float] = {}
        self.stragglers: dict[str, dict[str, Any]] = {}
        #: GPU index -> its last (utilisation, power, power limit) readings.
        self.recent_gpus: dict[
            int, deque[tuple[float, tuple[float | None, float | None, float | None]]]
        ] = {}
        self.uninterruptible: list[str] = []
        #: Whether a process of the tree was running or runnable, in each recent sample.
        self.recent_running: deque[tuple[float, bool]] = deque(maxlen=ACTIVITY_SAMPLES)
        #: When the progress dir last changed (seconds), as the progress events said.
        self.last_progress_t: float | None = None
        self.peak_tree_rss: int | None = None
        self.peak_machine_used: int | None = None
        #: Series -> what the live judgement said of it (``trend`` events): when a leak was
        #: first called, and when (if) it was withdrawn.
        self.live_calls: dict[str, dict[str, float | None]] = {}
        # Progress rate: file changes, and the training steps' own rate when they are written.
        self.step_rate = SeriesBuffer()
        self.rate = SeriesBuffer()
        self._rate_start: float | None = None
        self._rate_changes = 0
        self._rate_bytes = 0

    @property
    def roles(self) -> dict[int, dict[str, Any]]:
        """pid -> role of the processes of the tree that have one (see :class:`RoleFold`)."""
        return self.role_fold.roles

    # -- folding -------------------------------------------------------------------------

    def configure(self, config: dict[str, Any]) -> None:
        """Take the soak's settings from the journal header's ``config``."""
        interval = config.get("sample_interval_seconds")
        self.interval = float(interval) if isinstance(interval, int | float) else None
        self.detailed_memory = bool(config.get("detailed_memory"))
        warm_up = config.get("warm_up_seconds")
        self.warm_up_seconds = float(warm_up) if isinstance(warm_up, int | float) else None
        self.budgets = Budgets(
            max_rss_bytes=config.get("max_rss_bytes"),
            max_gpu_memory_bytes=config.get("max_gpu_memory_bytes"),
            min_disk_free_bytes=config.get("min_disk_free_bytes"),
        )

    def add_limits(self, event: LimitsJson) -> None:
        # Read by name, as the lists of the fields kept name them.
        fields: Mapping[str, Any] = event
        for key in ("memory_total_bytes", "cgroup_memory_max_bytes"):
            if fields.get(key) is not None:
                self.limits[key] = int(fields[key])
        for key in MEMORY_CGROUP_LIMITS:
            if fields.get(key) is not None:
                self.limits[key] = fields[key]
        self.limits["disk_total_bytes"].update(event.get("disk_total_bytes") or {})

    def add_live_call(self, t: float, event: TrendJson) -> None:
        """A ``trend`` event: the live judgement called a leak, or withdrew one."""
        series, verdict = str(event.get("series")), event.get("verdict")
        if verdict == "leak":
            self.live_calls[series] = {"first_seen": round(t, 3), "withdrawn": None}
        elif verdict == "withdrawn" and series in self.live_calls:
            self.live_calls[series]["withdrawn"] = round(t, 3)

    def end(self, t: float) -> None:
        """The command exited or is being stopped: what follows is shutdown, not the run."""
        if self.end_t is None:
            self.end_t = t

    def add_sample(self, t: float, event: SampleJson) -> None:
        if self.end_t is not None and t > self.end_t:
            return
        if self.first_t is None:
            self.first_t = t
            if self._rate_start is None:
                self._rate_start = t
        self.last_t = max(self.last_t, t)
        tree = event.get("tree") or {}
        if not tree.get("processes"):
            return  # the tree is gone (or not started): nothing of the run to judge
        rss = tree.get("rss_bytes")
        if rss is not None:
            self.peak_tree_rss = max(self.peak_tree_rss or 0, int(rss))
        # Judged: the memory that can run out (anonymous + shared), never the clean
        # file-backed pages of an mmap'd dataset or the page cache.  A journal written
        # before the sampler told them apart has RSS (and PSS) only: judged as it was then.
        for key, figure in TREE_MEMORY_SERIES:
            value = tree.get(key.removeprefix("tree."))
            if value is not None:
                self._track(key, "bytes", f"tree memory ({figure})").add(t, value)
                self.tree_memory = (figure, int(value))
                break
        self._track("tree.fds", "count", "open files of the tree").add(t, tree.get("fds"))
        self._track("tree.threads", "count", "threads of the tree").add(t, tree.get("threads"))
        self._track("tree.processes", "count", "processes of the tree").add(
            t, tree.get("processes")
        )
        cpu = tree.get("cpu_percent")
        ranks = self.role_fold.add(event.get("processes") or [])
        ranks_cpu = [figure for figure in ranks.values() if figure is not None]
        if ranks_cpu:
            self.cpu_of = "ranks"
            cpu = sum(ranks_cpu)
        if cpu is not None:
            self.recent_cpu.append((t, float(cpu)))
        machine = event.get("machine") or {}
        used = machine.get("memory_used_bytes")
        if used is not None:
            self.peak_machine_used = max(self.peak_machine_used or 0, int(used))
        self._track(
            "machine.shm_used_bytes", "bytes", "the machine's shared memory in /dev/shm"
        ).add(t, machine.get("shm_used_bytes"))
        for label, disk in (event.get("disks") or {}).items():
            free = disk.get("free_bytes")
            if free is None:
                continue
            self.disk_free[label] = (str(disk.get("path")), int(free))
            self._track(
                f"disk.{label}.free_bytes", "bytes", f"free space of the {label} filesystem", "down"
            ).add(t, free)
        uninterruptible = []
        running = False
        for proc in event.get("processes") or []:
            self._add_process(t, proc)
            state = proc.get("state")
            if state == "disk-sleep":
                uninterruptible.append(f"pid {proc.get('pid')} ({proc.get('name')})")
            # Once the tree has ranks, theirs: a launcher polling them says nothing.
            counts = self.cpu_of != "ranks" or self.role_fold.is_rank(int(proc["pid"]))
            running = running or (counts and state == "running")
        self.uninterruptible = uninterruptible
        if event.get("processes"):
            self.recent_running.append((t, running))
        self._close_rate_bucket(t)
        self._judge_stragglers(t)

    def _track(
        self,
        key: str,
        unit: str,
        label: str,
        direction: Direction = "up",
        pid: int | None = None,
        name: str | None = None,
    ) -> Track:
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = Track(unit, label, direction, pid, name)
        return track

    def _add_process(self, t: float, proc: dict[str, Any]) -> None:
        if proc.get("state") == "zombie":
            return  # exited, not yet reaped: its RSS of 0 is no figure of its run
        pid = int(proc["pid"])
        rss = int(proc.get("rss_bytes") or 0)
        anon = proc.get("anon_bytes")
        # Judged: anonymous + shared memory; RSS in a journal written before it was read.
        judged, key = (rss, "rss_bytes") if anon is None else (int(anon), "anon_bytes")
        record = self.processes.get(pid)
        if record is None:
            if len(self.processes) >= MAX_TRACKED_PROCESSES and not self._evict(t):
                self.processes_not_followed += 1
                return
            record = self.processes[pid] = ProcessRecord(
                pid=pid,
                name=str(proc.get("name") or "?"),
                first_t=t,
                last_t=t,
                first_rss=rss,
                peak_rss=rss,
                last_rss=rss,
            )
        record.last_t = t
        record.last_rss = rss
        record.role = self.role_fold.roles.get(pid)
        name = proc.get("name")
        if name and name != record.name:
            # exec() renamed it (a launcher's shim becomes python): name what runs now.
            record.name = str(name)
            for track, what in ((record.rss, "memory"), (record.gpu, "GPU memory")):
                if track is not None:
                    track.name = record.name
                    track.label = f"{what} of pid {pid} ({record.name})"
        record.peak_rss = max(record.peak_rss, rss)
        record.peak_anon = max(record.peak_anon, judged)
        threads = proc.get("threads")
        if threads is not None:
            record.peak_threads = max(record.peak_threads, int(threads))
        cpu = proc.get("cpu_percent")
        if cpu is not None:
            record.cpu_total += float(cpu)
            record.cpu_count += 1
        record.series.add(
            t,
            {
                "rss_bytes": rss,
                "anon_bytes": anon,
                "cpu_percent": cpu,
                "gpu_memory_bytes": record.gpu_now,
            },
        )
        if record.rss is None:
            record.rss = Track(
                "bytes", f"memory of pid {pid} ({record.name})", pid=pid, name=record.name
            )
            record.memory_key = key
        record.rss.add(t, judged)

    def _evict(self, t: float) -> bool:
        """Forget the smallest process that is gone, to make room; False when all are alive."""
        if self._no_room_at == t:
            return False  # every tracked process was seen at t: asking again finds none gone
        gone = [r for r in self.processes.values() if r.last_t < t]
        if not gone:
            self._no_room_at = t
            return False
        smallest = min(gone, key=lambda r: r.peak_rss)
        del self.processes[smallest.pid]
        return True

    def tree_gone(self, t: float) -> None:
        if self.tree_gone_t is None:
            self.tree_gone_t = t

    def add_gpu_sample(self, t: float, event: GpuSampleJson) -> None:
        for gpu in event.get("gpus") or []:
            used = gpu.get("memory_used_mib")
            if gpu.get("index") is not None and used is not None:
                self.gpu_used_at_start.setdefault(int(gpu["index"]), int(used * MiB))
        if self.tree_gone_t is not None and t > self.tree_gone_t:
            # The GPU sampler keeps a process list for an interval and some slack after
            # nvidia-smi's loop last printed one: readings that soon after may be stale.
            settled = self.tree_gone_t + (self.interval or 0.0) + GPU_SETTLE_SECONDS
            if self.gpu_after_tree is None and t >= settled:
                self.gpu_after_tree = event
            return
        if self.end_t is not None and t > self.end_t:
            return
        for gpu in event.get("gpus") or []:
            index = gpu.get("index")
            if index is None:
                continue
            self.recent_gpus.setdefault(int(index), deque(maxlen=ACTIVITY_SAMPLES)).append(
                (
                    t,
                    (
                        gpu.get("utilization_gpu_percent"),
                        gpu.get("power_draw_w"),
                        gpu.get("power_limit_w"),
                    ),
                )
            )
            total = gpu.get("memory_total_mib")
            if total is not None:
                self.gpu_total[int(index)] = int(total * MiB)
            used = gpu.get("memory_used_mib")
            self._track(f"gpu{index}.memory_used_bytes", "bytes", f"memory of GPU {index}").add(
                t, None if used is None else used * MiB
            )
        processes = event.get("processes")
        if processes is None:
            return
        tree_total = 0
        for proc in processes:
            if not proc.get("in_tree"):
                continue
            used = proc.get("used_gpu_memory_mib")
            value = None if used is None else int(used * MiB)
            tree_total += value or 0
            if proc.get("gpu_index") is not None and value:
                self.gpus_of_tree.add(int(proc["gpu_index"]))
                self.gpu_pids_of_tree[int(proc["pid"])] = str(proc.get("name") or "?")
            record = self.processes.get(int(proc["pid"]))
            if record is not None and value is not None:
                record.gpu_now = value
                record.peak_gpu = max(record.peak_gpu or 0, value)
                if record.gpu is None:
                    record.gpu = Track(
                        "bytes",
                        f"GPU memory of pid {record.pid} ({record.name})",
                        pid=record.pid,
                        name=record.name,
                    )
                record.gpu.add(t, value)
        self.tree_gpu_bytes = tree_total
        self._track("tree.gpu_memory_bytes", "bytes", "GPU memory of the tree").add(t, tree_total)

    def add_step_rate(self, t: float, steps_per_second: float | None) -> None:
        if steps_per_second is not None:
            self.step_rate.add(t, {"steps_per_second": steps_per_second})

    def add_progress(self, t: float, event: ProgressJson) -> None:
        self.last_progress_t = max(t, self.last_progress_t or t)
        if self.end_t is None or t <= self.end_t:
            window = self.straggler_window()
            for rank, grown in (event.get("rank_grown_bytes") or {}).items():
                if rank in self.rank_progress or len(self.rank_progress) < MAX_RANK_SERIES:
                    points = self.rank_progress.setdefault(rank, deque())
                    points.append((t, int(grown)))
                    while points[0][0] < t - window:
                        points.popleft()  # only the last window is ever measured
        if self._rate_start is None:
            self._rate_start = t
        self._rate_changes += int(event.get("changed") or 0)
        self._rate_bytes += int(event.get("grown_bytes") or 0)

    def straggler_window(self) -> float:
        """How long a rank must stay behind, and the span its rate is measured over."""
        return max(STRAGGLER_MIN_SECONDS, STRAGGLER_INTERVALS * (self.interval or 1.0))

    def _judge_stragglers(self, t: float) -> None:
        """A rank whose progress rate stays below STRAGGLER_RATIO of the ranks' median for a
        whole window is a straggler (found once; see :meth:`straggler_window`)."""
        if len(self.rank_progress) < 2 or self.first_t is None:
            return
        window = self.straggler_window()
        if t - self.first_t < window:
            return  # not one whole window of the run yet
        rates: dict[str, float] = {}
        for rank, points in self.rank_progress.items():
            while points and points[0][0] < t - window:
                points.popleft()
            rates[rank] = sum(grown for _, grown in points) / window * 60
        median_rate = median(list(rates.values()))
        if median_rate <= 0:
            self._behind_since.clear()  # every rank stopped: a stall, not a straggler
            return
        for rank, rate in rates.items():
            if rate >= STRAGGLER_RATIO * median_rate:
                self._behind_since.pop(rank, None)
                continue
            since = self._behind_since.setdefault(rank, t)
            if t - since >= window and rank not in self.stragglers:
                self.stragglers[rank] = {
                    "rank": int(rank),
                    "rate_per_minute": round(rate, 1),
                    "median_rate_per_minute": round(median_rate, 1),
                    "behind_seconds": round(t - since, 3),
                    "t": round(t, 3),
                }

    def _close_rate_bucket(self, t: float) -> None:
        start = self._rate_start
        if start is None:
            return
        low, high = RATE_BUCKET_BOUNDS
        width = min(high, max(low, RATE_BUCKET_INTERVALS * (self.interval or 1.0)))
        if t - start < width:
            return
        minutes = (t - start) / 60
        self.rate.add(
            t,
            {
                "changes_per_minute": round(self._rate_changes / minutes, 3),
                "bytes_per_minute": round(self._rate_bytes / minutes, 1),
            },
        )
        self._rate_start = t
        self._rate_changes = 0
        self._rate_bytes = 0

    # -- judging -------------------------------------------------------------------------

    def analysed_from(self, *, live: bool = False) -> float:
        """Start of the analysed span of the run (the machine's and the disks' series).

        At the end the default warm-up is 10 % of the run.  During the run it is also at least
        ``LIVE_WARM_UP_INTERVALS`` samples (at most ``WARM_UP_MAX_SECONDS``): early on, a
        warm-up ramp is all there is to see, and it rises exactly like a leak until it ends.
        """
        first = self.first_t or 0.0
        if self.warm_up_seconds is not None:
            return first + self.warm_up_seconds
        track = next((self.tracks[k] for k, _ in TREE_MEMORY_SERIES if k in self.tracks), None)
        return self._warm_up_end(first, track.floors.times if track is not None else [], live)

    def _warm_up_end(self, first: float, times: list[float], live: bool) -> float:
        """The end of the default warm-up of a series born at ``first`` sampled at ``times``."""
        warm_up = default_warm_up(times)
        if live:
            floor = LIVE_WARM_UP_INTERVALS * (self.interval or 1.0)
            warm_up = max(warm_up, min(WARM_UP_MAX_SECONDS, floor))
        return first + warm_up

    def judged(self) -> Iterable[tuple[str, Track]]:
        """Every judged series with its key: the tree's and machine's, then the top processes."""
        yield from self.tracks.items()
        top = sorted(self.processes.values(), key=lambda r: -r.peak_anon)[:JUDGED_PROCESSES]
        with_gpu = [r for r in self.processes.values() if r.gpu is not None]
        for record in top:
            if record.rss is not None:
                yield f"process.{record.pid}.{record.memory_key}", record.rss
        for record in with_gpu:
            assert record.gpu is not None
            yield f"process.{record.pid}.gpu_memory_bytes", record.gpu

    def evaluate(
        self, wall: Callable[[float], str | None], *, live: bool = False
    ) -> dict[str, dict[str, Any]]:
        """The ``trends`` object: every series judged over the same analysed span.

        ``wall`` turns seconds since the start into an ISO time (for projections); ``live``:
        judged during the run (see :meth:`analysed_from`).
        """
        start = self.analysed_from(live=live)
        stop = self.last_t
        if self.end_t is not None:
            # A process frees its memory while it exits (Python tears its objects down over
            # several samples at a short interval): the last moments are no floor of the run.
            stop = self.end_t - max(SHUTDOWN_SAMPLES * (self.interval or 0.0), SHUTDOWN_SECONDS)
        span = max(0.0, stop - start)
        judged: list[tuple[str, Track, list[float], float]] = []
        # A process born late (a launcher's ranks, a worker) has a start-up ramp of its own
        # (imports, a caching allocator, a process group), which rises like a leak until it
        # ends: its warm-up runs from its birth, not the run's start.  The tree's memory, files
        # and threads sum its processes: they are judged once every judged process's
        # warm-up is over.
        tree_start = start
        for key, track in self.judged():
            times = track.floors.times[: bisect.bisect_right(track.floors.times, stop)]
            if not times:
                continue
            series_start = start
            if track.pid is not None:
                if not self._covers(times, start, stop, span):
                    continue  # lived through too little of the span to be judged
                if self.warm_up_seconds is None:
                    series_start = max(start, self._warm_up_end(times[0], times, live))
                    tree_start = max(tree_start, series_start)
            judged.append((key, track, times, series_start))
        out: dict[str, dict[str, Any]] = {}
        for key, track, times, series_start in judged:
            if key.startswith("tree."):
                series_start = tree_start
            min_growth, min_ratio = SERIES_UNITS[track.unit]
            trend = estimate_trend(
                times,
                track.floors.column("v")[: len(times)],
                min_growth=min_growth,
                min_ratio=min_ratio,
                warm_up_seconds=max(0.0, series_start - times[0]),
                direction=track.direction,
            )
            out[key] = self._entry(key, track, trend, wall)
        rate = self._rate_entry(start, self.rate, "changes_per_minute")
        if rate is not None:
            out["progress.changes_per_minute"] = rate
        step_rate = self._rate_entry(start, self.step_rate, "steps_per_second")
        if step_rate is not None:
            out["progress.steps_per_second"] = step_rate
        return out

    def _covers(self, times: list[float], start: float, stop: float, span: float) -> bool:
        """Whether a process lived through enough of the analysed span to be judged: most of
        it, or its recent part (a worker born late, still there at the end)."""
        covered = times[-1] - max(times[0], start)
        if covered >= PROCESS_COVERAGE * span:
            return True
        alive_at_end = times[-1] >= stop - ALIVE_AT_END_INTERVALS * (self.interval or 1.0)
        return alive_at_end and covered >= RECENT_FRACTIONS[-1] * span

    def _entry(
        self,
        key: str,
        track: Track,
        trend: Trend,
        wall: Callable[[float], str | None],
    ) -> dict[str, Any]:
        limit, source = self._limit(key, track)
        seconds = None
        if trend.verdict == "leak" and limit is not None:
            seconds = trend.seconds_to(limit)
        interval = trend.slope_interval_per_hour
        note = None
        if key in ("tree.anon_bytes", "tree.rss_bytes") and (self.peak_tree_rss or 0) > (
            self.peak_machine_used or 0
        ):
            note = (
                "the tree's summed memory counts pages shared between processes (forked "
                "workers) once per process, so it can exceed the machine's used memory; "
                "--detailed-memory uses PSS instead"
            )
        return {
            "verdict": trend.verdict,
            "unit": track.unit,
            "label": track.label,
            "pid": track.pid,
            "name": track.name,
            "slope_per_hour": _round(trend.slope_per_hour),
            "slope_interval_per_hour": (
                None if interval is None else [_round(interval[0]), _round(interval[1])]
            ),
            "growth": _round(trend.growth),
            "span_seconds": round(trend.span_seconds, 3),
            "analysed_from": _round(trend.analysed_from),
            "samples": trend.samples,
            "first": _round(trend.first),
            "last": _round(trend.last),
            "limit": limit,
            "limit_source": source,
            "projected_seconds_to_limit": _round(seconds),
            "projected_limit_at": None if seconds is None else wall(self.last_t + seconds),
            "reason": trend.reason,
            "note": note,
            "onset": _round(trend.onset),
            # The live judgement of the same series: when it first called the leak (seconds
            # since the start), and when it withdrew it, if it did.
            "live": self.live_calls.get(key),
        }

    def _limit(self, key: str, track: Track) -> tuple[int | None, str | None]:
        """The nearest known limit of a series, and what it is."""
        budgets = self.budgets
        candidates: list[tuple[int | None, str]] = []
        if key.endswith(MEMORY_SUFFIXES):
            if self.limits["memory_limit_source"] is not None:
                # The lowest of the machine's and the command's cgroup's, named at the start.
                memory = [(self.limits["memory_limit_bytes"], self.limits["memory_limit_source"])]
            else:  # a journal from before the cgroup's limits were named
                memory = [
                    (self.limits["memory_total_bytes"], "machine memory"),
                    (self.limits["cgroup_memory_max_bytes"], "cgroup memory.max"),
                ]
            candidates = memory
            if not key.startswith("machine."):  # the budget is the tree's, not /dev/shm's
                candidates = [*memory, (budgets.max_rss_bytes, "max_rss_bytes")]
        elif key.startswith("gpu") and key.endswith(".memory_used_bytes"):
            index = int(key[3 : key.index(".")])
            candidates = [(self.gpu_total.get(index), "GPU memory")]
        elif key.endswith("gpu_memory_bytes"):
            total = max(self.gpu_total.values()) if self.gpu_total else None
            if key.startswith("tree."):
                total = sum(self.gpu_total.values()) if self.gpu_total else None
            candidates = [
                (total, "GPU memory"),
                (budgets.max_gpu_memory_bytes, "max_gpu_memory_bytes"),
            ]
        elif track.direction == "down":
            if budgets.min_disk_free_bytes is not None:
                return budgets.min_disk_free_bytes, "min_disk_free_bytes"
            return 0, "filesystem"
        known = [(value, source) for value, source in candidates if value is not None]
        if not known:
            return None, None
        return min(known)

    def _rate_entry(self, start: float, series: SeriesBuffer, name: str) -> dict[str, Any] | None:
        times = series.times
        rates = series.column(name)
        if len(times) < 2:
            return None
        slowing = progress_slowing(times, rates, analysed_from=start)
        analysed = [r for ti, r in zip(times, rates, strict=True) if ti >= start and r is not None]
        return {
            "verdict": "slowing"
            if slowing
            else ("stable" if len(analysed) >= 8 else "inconclusive"),
            "unit": "per_minute" if name == "changes_per_minute" else "per_second",
            "label": "progress rate" if name == "changes_per_minute" else "step rate",
            "pid": None,
            "name": None,
            "slope_per_hour": None,
            "slope_interval_per_hour": None,
            "growth": None,
            "span_seconds": round(max(0.0, times[-1] - start), 3),
            "analysed_from": round(start, 3),
            "samples": len(analysed),
            "first": None if slowing is None else round(slowing[0], 3),
            "last": None if slowing is None else round(slowing[1], 3),
            "limit": None,
            "limit_source": None,
            "projected_seconds_to_limit": None,
            "projected_limit_at": None,
            "reason": "progress fell below half its early rate" if slowing else "",
            "note": None,
        }

    def gpu_not_released(self) -> list[str]:
        """What the GPUs still held of the tree once it was gone: a process of the tree still
        listed with GPU memory (a context nobody freed), or a GPU the tree used holding more
        than at the start by over ``GPU_RELEASE_FLOOR_BYTES`` (``GPU_RELEASE_FLOOR_RATIO`` of
        its memory, whichever is larger).  Empty without a GPU sample after the tree was gone.
        """
        after = self.gpu_after_tree
        if after is None or not self.gpus_of_tree:
            return []
        out = []
        for proc in after.get("processes") or []:
            pid = proc.get("pid")
            used = proc.get("used_gpu_memory_mib")
            if pid in self.gpu_pids_of_tree and used:
                out.append(
                    f"GPU {proc.get('gpu_index')} still lists pid {pid} "
                    f"({self.gpu_pids_of_tree[pid]}) of the tree holding "
                    f"{format_amount(used * MiB, 'bytes')} after the tree was gone: "
                    "GPU memory not given back"
                )
        for gpu in after.get("gpus") or []:
            index, used = gpu.get("index"), gpu.get("memory_used_mib")
            if index not in self.gpus_of_tree or used is None:
                continue
            start = self.gpu_used_at_start.get(index)
            total = self.gpu_total.get(index, 0)
            floor = max(GPU_RELEASE_FLOOR_BYTES, GPU_RELEASE_FLOOR_RATIO * total)
            if start is not None and used * MiB - start >= floor:
                out.append(
                    f"GPU {index} holds {format_amount(used * MiB - start, 'bytes')} more "
                    "than at the start after the tree was gone: GPU memory not given back"
                )
        return out

    def top_processes(self) -> list[dict[str, Any]]:
        top = sorted(self.processes.values(), key=lambda r: -r.peak_rss)[:TOP_PROCESSES]
        return [r.to_json() for r in top]

    def activity(self) -> dict[str, Any]:
        """What a stalled tree is doing (busy, idle, in uninterruptible sleep) and its GPUs
        (idle, busy, busy at low power), over its last samples taken in the stall (see
        :meth:`stalled`): see ``_activity``.

        The median CPU, not the mean: the first sample after a stall begins still carries the
        work just before it, and one such sample would drag a short window's mean up (the
        views' ``series_typical`` reads a stall window the same way)."""
        cpus: list[float] = self.stalled(self.recent_cpu)
        cpu = _median(cpus)
        running = self.stalled(self.recent_running)
        share = sum(running) / len(running) if running else None
        return stall_activity(
            cpu, self.uninterruptible, share, self.recent_gpu_activity(), cpu_of=self.cpu_of
        )

    def recent_gpu_activity(self) -> list[GpuActivity]:
        """The tree's GPUs (every GPU while none is known to be the tree's), their medians over
        the last samples taken in the stall."""
        indices = sorted(self.gpus_of_tree or self.recent_gpus)
        activity = []
        for index in indices:
            readings = self.stalled(self.recent_gpus.get(index, deque()))
            activity.append(
                GpuActivity(
                    index,
                    _median([u for u, _, _ in readings]),
                    _median([p for _, p, _ in readings]),
                    _median([limit for _, _, limit in readings]),
                )
            )
        return activity

    def stalled(self, recent: deque[tuple[float, _Reading]]) -> list[_Reading]:
        """The recent readings measured after the last progress.

        The last samples before a stall's rule fires may still hold the work before it (10
        samples at a 5 s interval are 50 s, against a stall rule of 10 s): those of the stall
        say what the tree does now.  A sample measures the interval before it: the readings
        whose whole interval follows the last progress, else those taken after it, else all
        (no progress yet: the whole run is the stall).
        """
        since = self.last_progress_t
        if since is not None:
            interval = self.interval or 0.0
            after = [v for t, v in recent if t - interval >= since] or [
                v for t, v in recent if t > since
            ]
            if after:
                return after
        return [v for _, v in recent]


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return median(known) if known else None


def straggler_text(found: dict[str, Any]) -> str:
    """``rank 1 is a straggler: its progress files grew 300 B/min against the ranks' median
    1.2 KiB/min (25 %), behind for 5.0s``."""
    rate, median = float(found["rate_per_minute"]), float(found["median_rate_per_minute"])
    return (
        f"rank {found['rank']} is a straggler: its progress files grew "
        f"{format_amount(rate, 'bytes')}/min against the ranks' median "
        f"{format_amount(median, 'bytes')}/min ({100 * rate / median:.0f}%), "
        f"behind for {found['behind_seconds']:.1f}s"
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


__all__ = ["Budgets", "TrendWatch", "describe_growth", "format_amount", "straggler_text"]
