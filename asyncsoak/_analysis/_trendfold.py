"""The fold of a run's series in bounded memory (the tree's, its processes', the GPUs', the
progress rates), live and in ``recover``, which :class:`~._trendwatch.TrendWatch` judges."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._contract import SeriesBuffer, events
from .._process import RoleFold
from ._trends import Direction, median

MiB = 2**20
#: Processes followed at most (a run that spawns a worker per step must not grow the monitor).
MAX_TRACKED_PROCESSES = 64
#: A rank whose progress rate stays under this share of the median rank's for a whole window
#: (this many sample intervals, at least STRAGGLER_MIN_SECONDS) is a straggler.
STRAGGLER_RATIO = 0.5
STRAGGLER_INTERVALS = 20
STRAGGLER_MIN_SECONDS = 2.0
#: A stalled tree's activity is judged on its last this many samples, from at least
#: ACTIVITY_MIN_SAMPLES of the stall.
ACTIVITY_SAMPLES = 10
#: The tree's judged memory, by preference (the first the sample has); RSS in old journals.
TREE_MEMORY_SERIES = (
    ("tree.anon_pss_bytes", "anonymous + shared, PSS"),
    ("tree.anon_bytes", "anonymous + shared"),
    ("tree.pss_bytes", "PSS"),
    ("tree.rss_bytes", "RSS"),
)

#: How long after the tree is gone (plus an interval) a GPU's process list may still be stale.
GPU_SETTLE_SECONDS = 1.0


@dataclass(slots=True)
class Track:
    """One judged series: its floors over time and how to name it."""

    unit: str
    label: str
    direction: Direction = "up"
    pid: int | None = None
    name: str | None = None
    floors: SeriesBuffer = field(default_factory=lambda: SeriesBuffer(256, keep="min"))
    last: float | None = None
    #: The point of ``last``, given again while the value holds (no dict per sample).
    point: dict[str, float] | None = None

    def add(self, t: float, value: float | None) -> None:
        if value is None or not math.isfinite(value):
            return
        if self.point is None or value != self.last:
            self.point = {"v": value}
        self.floors.add(t, self.point)
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
    peak_anon: int = 0
    cpu_total: float = 0.0
    cpu_count: int = 0
    peak_threads: int = 0
    peak_gpu: int | None = None
    gpu_now: int | None = None
    series: SeriesBuffer = field(default_factory=lambda: SeriesBuffer(200))
    #: The judged memory (anonymous + shared; RSS in older journals) and its key's last part.
    rss: Track | None = None
    memory_key: str = "anon_bytes"
    gpu: Track | None = None
    role: dict[str, Any] | None = None
    #: The figures last folded: given again (a sleeping process's), only time and CPU move.
    figures: dict[str, Any] | None = None
    #: The last point of ``series``, given again while its figures are.
    point: dict[str, Any] | None = None

    def label(self, what: str) -> str:
        return f"{what} of pid {self.pid} ({self.name})"

    def track(self, what: str) -> Track:
        return Track("bytes", self.label(what), pid=self.pid, name=self.name)

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


class TrendFold:
    """Folds samples, GPU samples, progress and limits into bounded trend state."""

    def __init__(self) -> None:
        self.tracks: dict[str, Track] = {}
        self.processes: dict[int, ProcessRecord] = {}
        self._no_room_at: float | None = None
        self.limits: dict[str, Any] = {
            "memory_total_bytes": None,
            "cgroup_memory_max_bytes": None,
            "disk_total_bytes": {},
            **dict.fromkeys(events.MEMORY_CGROUP_LIMITS),
        }
        self.gpu_total: dict[int, int] = {}
        # For gpu_not_released: the GPUs at the start, the tree's GPUs and pids, after it.
        self.gpu_used_at_start: dict[int, int] = {}
        self.gpus_of_tree: set[int] = set()
        self.gpu_pids_of_tree: dict[int, str] = {}
        self.tree_gone_t: float | None = None
        self.gpu_after_tree: events.GpuSampleJson | None = None
        self.interval: float | None = None
        self.warm_up_seconds: float | None = None
        #: The caller's budgets (None: no budget), which projections are judged against.
        self.budgets: dict[str, int | None] = {}
        self.first_t: float | None = None
        self.last_t = 0.0
        self.end_t: float | None = None
        #: (what is measured, bytes) of the tree's memory that can run out.
        self.tree_memory: tuple[str, int] | None = None
        self.tree_gpu_bytes: int | None = None
        self.disk_free: dict[str, tuple[str, int]] = {}  # label -> (path, free bytes)
        self.recent_cpu: deque[tuple[float, float]] = deque(maxlen=ACTIVITY_SAMPLES)
        #: Whose CPU ``recent_cpu`` is: the ranks' once there are ranks (a launcher polling
        #: them is busy or idle whatever they do), the whole tree's otherwise.
        self.cpu_of = "tree"
        self.role_fold = RoleFold()
        #: rank -> (when, bytes its progress files grew by), over the last straggler window.
        self.rank_progress: dict[str, deque[tuple[float, int]]] = {}
        self._behind_since: dict[str, float] = {}
        self.stragglers: dict[str, dict[str, Any]] = {}
        #: GPU index -> its last (utilisation, power, power limit) readings.
        self.recent_gpus: dict[
            int, deque[tuple[float, tuple[float | None, float | None, float | None]]]
        ] = {}
        self.uninterruptible: list[str] = []
        self.recent_running: deque[tuple[float, bool]] = deque(maxlen=ACTIVITY_SAMPLES)
        self.last_progress_t: float | None = None
        self.peak_tree_rss: int | None = None
        self.peak_machine_used: int | None = None
        #: Series -> when the live judgement first called a leak, and when (if) it withdrew it.
        self.live_calls: dict[str, dict[str, float | None]] = {}
        #: (series, verdict) a ``trend`` event told and no withdrawal took back.
        self.reported: set[tuple[str, str]] = set()
        #: Series whose judgement raised (a bug, never the run's fault) -> the exception.
        self.not_judged: dict[str, str] = {}
        self.step_rate = SeriesBuffer()
        self.rate = SeriesBuffer()
        self._rate_start: float | None = None
        self._rate_changes = 0
        self._rate_bytes = 0

    @property
    def roles(self) -> dict[int, dict[str, Any]]:
        """pid -> role of the processes of the tree that have one (see :class:`RoleFold`)."""
        return self.role_fold.roles

    def configure(self, config: dict[str, Any]) -> None:
        """Take the soak's settings from the journal header's ``config``."""
        interval, warm_up = config.get("sample_interval_seconds"), config.get("warm_up_seconds")
        self.interval = float(interval) if isinstance(interval, int | float) else None
        self.warm_up_seconds = float(warm_up) if isinstance(warm_up, int | float) else None
        budgets = ("max_rss_bytes", "max_gpu_memory_bytes", "min_disk_free_bytes")
        self.budgets = {key: config.get(key) for key in budgets}

    def add_limits(self, event: events.LimitsJson) -> None:
        fields: Mapping[str, Any] = event
        for key in ("memory_total_bytes", "cgroup_memory_max_bytes"):
            if fields.get(key) is not None:
                self.limits[key] = int(fields[key])
        for key in events.MEMORY_CGROUP_LIMITS:
            if fields.get(key) is not None:
                self.limits[key] = fields[key]
        self.limits["disk_total_bytes"].update(event.get("disk_total_bytes") or {})

    def add_live_call(self, t: float, event: events.TrendJson) -> None:
        """A ``trend`` event: the live judgement called a leak, or withdrew one."""
        series, verdict = str(event.get("series")), str(event.get("verdict"))
        if verdict == "leak":
            self.live_calls[series] = {"first_seen": round(t, 3), "withdrawn": None}
        elif verdict == "withdrawn":
            self.reported -= {(series, "leak"), (series, "breach_projected")}
            if series in self.live_calls:
                self.live_calls[series]["withdrawn"] = round(t, 3)
            return
        self.reported.add((series, verdict))

    def end(self, t: float) -> None:
        """The command exited or is being stopped: what follows is shutdown, not the run."""
        if self.end_t is None:
            self.end_t = t

    def add_sample(self, t: float, event: events.SampleJson) -> None:
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
        # Judged: the memory that can run out (anonymous + shared), never clean file pages.
        for key, figure in TREE_MEMORY_SERIES:
            value = tree.get(key.removeprefix("tree."))
            if value is not None:
                self._track(key, "bytes", f"tree memory ({figure})").add(t, value)
                self.tree_memory = (figure, int(value))
                break
        self._track("tree.fds", "count", "open files of the tree").add(t, tree.get("fds"))
        self._track("tree.threads", "count", "threads of the tree").add(t, tree.get("threads"))
        count = tree.get("processes")
        self._track("tree.processes", "count", "processes of the tree").add(t, count)
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
            counts = self.cpu_of != "ranks" or self.role_fold.is_rank(int(proc["pid"]))
            running = running or (counts and state == "running")
        self.uninterruptible = uninterruptible
        if event.get("processes"):
            self.recent_running.append((t, running))
        self._close_rate_bucket(t)
        self._judge_stragglers(t)

    def _track(self, key: str, unit: str, label: str, direction: Direction = "up") -> Track:
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = Track(unit, label, direction)
        return track

    def _add_process(self, t: float, proc: dict[str, Any]) -> None:
        record = self.processes.get(proc["pid"])
        if record is not None and proc is record.figures and record.rss is not None:
            # Given again (asleep): only time and CPU move, and its points are given again.
            record.last_t = t
            record.role = self.role_fold.roles.get(record.pid)
            self._add_point(t, record, proc, record.last_rss, proc.get("anon_bytes"))
            record.rss.add(t, record.rss.last)
            return
        if proc.get("state") == "zombie":
            return  # exited, not yet reaped: its RSS of 0 is no figure of its run
        pid = int(proc["pid"])
        record = self.processes.get(pid)
        full = record is None and len(self.processes) >= MAX_TRACKED_PROCESSES
        if full and not self._evict(t):
            return  # no room: its figures are not read
        rss = int(proc.get("rss_bytes") or 0)
        anon = proc.get("anon_bytes")
        judged, key = (rss, "rss_bytes") if anon is None else (int(anon), "anon_bytes")
        if record is None:
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
                    track.name, track.label = record.name, record.label(what)
        record.peak_rss = max(record.peak_rss, rss)
        record.peak_anon = max(record.peak_anon, judged)
        threads = proc.get("threads")
        if threads is not None:
            record.peak_threads = max(record.peak_threads, int(threads))
        self._add_point(t, record, proc, rss, anon)
        if record.rss is None:
            record.rss = record.track("memory")
            record.memory_key = key
        record.rss.add(t, judged)
        record.figures = proc

    @staticmethod
    def _add_point(
        t: float, record: ProcessRecord, proc: dict[str, Any], rss: int, anon: Any
    ) -> None:
        """The process's CPU figure counted and its point in its series."""
        cpu = proc.get("cpu_percent")
        if cpu is not None:
            record.cpu_total += float(cpu)
            record.cpu_count += 1
        point = record.point
        if (
            point is None
            or proc is not record.figures
            or point["gpu_memory_bytes"] != record.gpu_now
        ):
            point = record.point = {
                "rss_bytes": rss,
                "anon_bytes": anon,
                "cpu_percent": cpu,
                "gpu_memory_bytes": record.gpu_now,
            }
        record.series.add(t, point)

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

    def add_gpu_sample(self, t: float, event: events.GpuSampleJson) -> None:
        for gpu in event.get("gpus") or []:
            used = gpu.get("memory_used_mib")
            if gpu.get("index") is not None and used is not None:
                self.gpu_used_at_start.setdefault(int(gpu["index"]), int(used * MiB))
        if self.tree_gone_t is not None and t > self.tree_gone_t:
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
            power = (gpu.get("power_draw_w"), gpu.get("power_limit_w"))
            readings = (gpu.get("utilization_gpu_percent"), *power)
            self.recent_gpus.setdefault(int(index), deque(maxlen=ACTIVITY_SAMPLES)).append(
                (t, readings)
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
                    record.gpu = record.track("GPU memory")
                record.gpu.add(t, value)
        self.tree_gpu_bytes = tree_total
        self._track("tree.gpu_memory_bytes", "bytes", "GPU memory of the tree").add(t, tree_total)

    def add_step_rate(self, t: float, steps_per_second: float | None) -> None:
        if steps_per_second is not None:
            self.step_rate.add(t, {"steps_per_second": steps_per_second})

    def add_progress(self, t: float, event: events.ProgressJson) -> None:
        self.last_progress_t = max(t, self.last_progress_t or t)
        if self.end_t is None or t <= self.end_t:
            window = self.straggler_window()
            for rank, grown in (event.get("rank_grown_bytes") or {}).items():
                if rank in self.rank_progress or len(self.rank_progress) < 1024:  # ranks followed
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
        """Find the ranks that stayed behind for a whole window (see STRAGGLER_RATIO)."""
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
        width = min(60.0, max(0.5, 5 * (self.interval or 1.0)))  # five intervals, 0.5-60 s
        if t - start < width:
            return
        minutes = (t - start) / 60
        changes, grown = (
            round(self._rate_changes / minutes, 3),
            round(self._rate_bytes / minutes, 1),
        )
        self.rate.add(t, {"changes_per_minute": changes, "bytes_per_minute": grown})
        self._rate_start, self._rate_changes, self._rate_bytes = t, 0, 0
