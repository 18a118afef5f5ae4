"""The proc sampler against real process trees whose figures are known, and a fake /proc.

Real trees come from a small root process that makes itself a child subreaper (as the soak's
reaper does), forks workers that each write a known number of MiB, and reports every pid once
all of them are ready.  The fake /proc covers what a real tree cannot show on demand: a pid
reused between two samples, a process vanishing mid-read, a read that hangs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from asyncsoak._contract import events
from asyncsoak._contract._blocking import next_tick
from asyncsoak._contract._redact import Masker
from asyncsoak._contract._sink import EventSink, SinkCounters, SoakClock, open_event_queue
from asyncsoak._record._artifact import RunState
from asyncsoak._record._serializer import journal_line_data
from asyncsoak._sampling._proc_sample import ProcessFigures, ProcSample
from asyncsoak._sampling._proc_sampler import CLOCK_TICKS, FULL_READ_SECONDS, PAGE_SIZE, ProcSampler
from asyncsoak._sampling._proc_task import run_proc_sampler
from asyncsoak._sampling._procfs import FILES_PER_PROCESS, OpenFiles, read_proc_file

MIB = 1 << 20

# The tree's root.  argv[1] is a JSON spec: {"mib": k, "roles": [...]}.  Roles: "idle",
# "burner" (spins), "parent" (forks a "leaf"), "renamed" (comm with spaces and parentheses),
# "daemon" (double-forks and calls setsid), "churner" (forks short-lived children nonstop).
# Every process writes k MiB, then reports "role pid"; the root prints all of them as JSON.
# EOF on stdin ends the tree: each process blocks reading it, spinning ones are killed.
TREE_ROOT = r"""
import ctypes, json, os, signal, sys
spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_CHILD_SUBREAPER = 1, 15, 36
libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
ready_r, ready_w = os.pipe()

def become(role):
    try:
        if role != "daemon":
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for fd in (ready_r, 1):  # only the root reports, so only it holds stdout
            try:
                os.close(fd)
            except OSError:  # a leaf's parent closed them already
                pass
        if role == "daemon":
            os.setsid()
        if role == "renamed":
            libc.prctl(PR_SET_NAME, b"odd) (name x", 0, 0, 0)
        memory = b"\x01" * (spec["mib"] << 20)
        if role == "parent":
            fork("leaf")
        os.write(ready_w, f"{role} {os.getpid()}\n".encode())
        if role == "burner":
            while True:
                pass
        if role == "churner":
            while True:
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
        os.read(0, 1)
    finally:
        os._exit(0)

def fork(role):
    pid = os.fork()
    if pid == 0:
        become(role)
    return pid

spinning = []
expected = 0
for role in spec["roles"]:
    expected += 2 if role == "parent" else 1
    if role == "daemon":
        middle = os.fork()
        if middle == 0:
            fork("daemon")
            os._exit(0)
        os.waitpid(middle, 0)
    else:
        pid = fork(role)
        if role in ("burner", "churner"):
            spinning.append(pid)
os.close(ready_w)
reports = b""
while reports.count(b"\n") < expected:
    chunk = os.read(ready_r, 65536)
    if not chunk:
        sys.exit("a process of the tree died before it was ready")
    reports += chunk
roles = {}
for line in reports.decode().splitlines():
    role, pid = line.split()
    roles[pid] = role
print(json.dumps(roles), flush=True)
os.read(0, 1)
for pid in spinning:
    os.kill(pid, signal.SIGKILL)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""


@dataclass
class Tree:
    root: subprocess.Popen[bytes]
    roles: dict[int, str]

    @property
    def pid(self) -> int:
        return self.root.pid

    def pids(self, role: str | None = None) -> set[int]:
        return {pid for pid, r in self.roles.items() if role is None or r == role}


def _read_line(stream: Any, timeout: float) -> bytes:
    """One line from a pipe, or an error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise TimeoutError(f"no line within {timeout} s (got {data!r})")
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the tree's root exited (got {data!r})")
            data += chunk
    return data


@contextlib.contextmanager
def real_tree(roles: list[str], mib: int = 1) -> Iterator[Tree]:
    root = subprocess.Popen(
        [sys.executable, "-c", TREE_ROOT, json.dumps({"roles": roles, "mib": mib})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert root.stdin is not None
    assert root.stdout is not None
    members: list[psutil.Process] = []
    try:
        reported = json.loads(_read_line(root.stdout, timeout=10))
        tree = Tree(root, {int(pid): role for pid, role in reported.items()})
        members = [psutil.Process(pid) for pid in tree.roles]
        yield tree
    finally:
        root.stdin.close()  # EOF: every process of the tree exits
        try:
            root.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(root.pid, signal.SIGKILL)
            root.wait(timeout=10)
        _, alive = psutil.wait_procs(members, timeout=5)
        for process in alive:  # psutil checks the pid was not reused before killing
            process.kill()
        root.stdout.close()


@pytest.fixture
def spawn_tree() -> Iterator[Callable[..., Tree]]:
    with contextlib.ExitStack() as stack:
        yield lambda roles, mib=1: stack.enter_context(real_tree(roles, mib))


@dataclass
class Collected:
    posted: list[events.Event]
    counters: SinkCounters

    @property
    def samples(self) -> list[ProcSample]:
        return [e for e in self.posted if isinstance(e, ProcSample)]

    def of(self, kind: type[events.Event]) -> list[events.Event]:
        return [e for e in self.posted if isinstance(e, kind)]


class HookedSink(EventSink):
    """The queue's end, calling ``hook`` with each sample once offered (a hook that raises
    is a hand-off that fails)."""

    def __init__(self, sink: EventSink, hook: Callable[[events.Event], None]) -> None:
        super().__init__(sink._send, sink.clock, sink.counters)
        self.hook = hook

    def offer(self, event: events.Event) -> bool:
        offered = super().offer(event)
        self.hook(event)
        return offered


async def collect(
    samples: int, hook: Callable[[events.Event], None] | None = None, **options: Any
) -> Collected:
    """Run the sampler until it has delivered ``samples`` samples, then cancel it."""
    options.setdefault("interval", 0.05)
    options.setdefault("disk_paths", {})
    sink, receive = open_event_queue(SoakClock())
    if hook is not None:
        sink = HookedSink(sink, hook)
    posted: list[events.Event] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(run_proc_sampler, sink, **options))
            async with receive:
                async for event in receive:
                    posted.append(event)
                    if sum(isinstance(e, ProcSample) for e in posted) == samples:
                        tg.cancel_scope.cancel()
                        break
    return Collected(posted, sink.counters)


def by_pid(sample: ProcSample) -> dict[int, ProcessFigures]:
    return {p.pid: p for p in sample.processes}


# Real trees ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_every_process_of_a_real_tree_is_counted_with_its_figures(
    spawn_tree: Callable[..., Tree],
) -> None:
    """Every descendant is sampled (root excluded) and its figures match the real process."""
    tree = spawn_tree(["idle"] * 20 + ["parent", "renamed", "daemon"], mib=8)
    got = await collect(2, root_pid=tree.pid)
    first, second = got.samples

    assert first.pids == second.pids == tree.pids()
    assert len(tree.pids()) == 24
    assert tree.pid not in first.pids
    assert first.tree.processes == 24
    assert first.tree.threads == 24
    # The run's state knows the tree from its samples (the GPU sampler and the OOM lookup
    # read it there).
    state = RunState()
    for sample in got.samples:
        state.add(journal_line_data(sample))
    assert state.tree_pids == second.pids
    assert state.seen_pids == first.pids | second.pids
    assert got.counters.sampler_errors == 0

    # Each process wrote 8 MiB of its own; a forked Python adds tens of MiB at most.
    assert 24 * 8 * MIB <= second.tree.rss_bytes <= 24 * 72 * MIB
    figures = by_pid(second)
    for pid in tree.pids():
        real = psutil.Process(pid)
        with real.oneshot():
            assert figures[pid].ppid == real.ppid()
            assert figures[pid].name == real.name()
            assert figures[pid].state == real.status() == "sleeping"
            assert figures[pid].threads == 1
            assert figures[pid].fds == real.num_fds()
            assert abs(figures[pid].rss_bytes - real.memory_info().rss) <= MIB
            assert figures[pid].rss_bytes >= 8 * MIB
            io = real.io_counters()
            assert (figures[pid].read_bytes, figures[pid].write_bytes) == (
                io.read_bytes,
                io.write_bytes,
            )
            assert by_pid(first)[pid].cmdline == real.cmdline()
        assert figures[pid].cmdline is None  # told once, at the first sample
    assert second.tree.fds == sum(p.fds or 0 for p in second.processes)
    [renamed] = tree.pids("renamed")
    assert figures[renamed].name == "odd) (name x"
    [leaf] = tree.pids("leaf")
    assert figures[leaf].ppid in tree.pids("parent")


@pytest.mark.asyncio
async def test_double_forked_setsid_process_stays_in_the_tree(
    spawn_tree: Callable[..., Tree],
) -> None:
    """A process that double-forks and calls setsid is reparented to the root and sampled."""
    tree = spawn_tree(["idle", "daemon"])
    [daemon] = tree.pids("daemon")
    assert os.getsid(daemon) == daemon != os.getsid(tree.pid)

    [sample] = (await collect(1, root_pid=tree.pid)).samples

    assert daemon in sample.pids
    assert by_pid(sample)[daemon].ppid == tree.pid


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_busy_process_shows_high_cpu_and_idle_ones_low(
    spawn_tree: Callable[..., Tree],
) -> None:
    """cpu_percent is None without history, then high for a spinning process, ~0 for idle."""
    tree = spawn_tree(["burner", "idle", "idle"])
    got = await collect(3, root_pid=tree.pid, interval=0.2)
    first, last = got.samples[0], got.samples[-1]

    assert first.tree.cpu_percent is None
    assert all(p.cpu_percent is None for p in first.processes)
    [burner] = tree.pids("burner")
    spinning = by_pid(last)[burner].cpu_percent
    assert spinning is not None
    # One thread spinning on a shared machine (two cores under a loaded suite gave it under a
    # fifth of one): well above idle, at most one core.
    assert 10 <= spinning <= 105
    for idle in tree.pids("idle"):
        idle_cpu = by_pid(last)[idle].cpu_percent
        assert idle_cpu is not None
        assert idle_cpu < 5
    assert last.tree.cpu_percent is not None
    assert last.tree.cpu_percent >= 10


@pytest.mark.asyncio
async def test_detailed_memory_reports_private_and_proportional_memory(
    spawn_tree: Callable[..., Tree],
) -> None:
    """With detailed_memory the tree's USS holds what each worker wrote; without, none."""
    tree = spawn_tree(["idle"] * 4, mib=8)

    [detailed] = (await collect(1, root_pid=tree.pid, detailed_memory=True)).samples
    [plain] = (await collect(1, root_pid=tree.pid)).samples

    uss, pss = detailed.tree.uss_bytes, detailed.tree.pss_bytes
    assert uss is not None
    assert pss is not None
    assert 4 * 8 * MIB <= uss <= pss <= detailed.tree.rss_bytes
    assert plain.tree.uss_bytes is None
    assert plain.tree.pss_bytes is None


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_tree_that_forks_and_reaps_nonstop_never_raises(
    spawn_tree: Callable[..., Tree],
) -> None:
    """Processes exiting between listing and reading are left out, never errors."""
    tree = spawn_tree(["churner", "idle"])

    got = await collect(10, root_pid=tree.pid, interval=0.01)

    assert got.counters.sampler_errors == 0
    assert got.of(events.SamplerNote) == []
    for sample in got.samples:
        assert tree.pids() <= sample.pids


@pytest.mark.asyncio
async def test_machine_and_disk_figures(tmp_path: Path) -> None:
    """Machine memory adds up to MemTotal; a missing path reports its parent's filesystem."""
    disks = {"progress": tmp_path / "not" / "yet", "output": tmp_path}

    first, second = (await collect(2, root_pid=os.getpid(), disk_paths=disks)).samples

    machine = second.machine
    assert machine.memory_used_bytes is not None
    assert machine.memory_available_bytes is not None
    total = machine.memory_used_bytes + machine.memory_available_bytes
    assert total == psutil.virtual_memory().total
    assert machine.memory_percent is not None
    assert 0 < machine.memory_percent < 100
    assert machine.swap_percent is not None
    assert 0 <= machine.swap_percent <= 100
    assert machine.load1 is not None
    assert machine.load1 >= 0
    assert first.machine.cpu_percent is None
    assert machine.cpu_percent is not None
    assert 0 <= machine.cpu_percent <= 100

    st = os.statvfs(tmp_path)
    for label, path in disks.items():
        disk = second.disks[label]
        assert disk.path == str(path)
        assert disk.free_bytes is not None
        assert abs(disk.free_bytes - st.f_bavail * st.f_frsize) < 256 * MIB
        assert disk.percent_used is not None
        assert 0 <= disk.percent_used <= 100

    points = second.series_points()
    assert set(points["tree"]) == {
        "cpu_percent",
        "rss_bytes",
        "anon_bytes",
        "processes",
        "threads",
        "fds",
        "read_bytes",
        "write_bytes",
    }
    assert points["machine"]["disk_free_bytes_progress"] == second.disks["progress"].free_bytes
    assert points["machine"]["memory_used_bytes"] == machine.memory_used_bytes
    assert second.summary_labels() == {}


@pytest.mark.asyncio
async def test_dirs_on_one_filesystem_get_one_disk_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output and progress dirs on one filesystem agree while the disk is being written
    to (each statvfs here sees 4 KiB less free); another filesystem keeps its own figures."""
    real_statvfs = os.statvfs
    calls: list[str] = []

    def filling_disk(path: Any) -> os.statvfs_result:
        calls.append(str(path))
        st = list(real_statvfs(path))
        st[4] -= len(calls) * 4096 // max(st[1], 1)  # f_bavail, in f_frsize blocks
        return os.statvfs_result(st)

    monkeypatch.setattr(os, "statvfs", filling_disk)
    disks = {"output": tmp_path, "progress": tmp_path / "runs" / "42", "proc": Path("/proc")}

    (sample,) = (await collect(1, root_pid=os.getpid(), disk_paths=disks)).samples

    assert sample.disks["output"].free_bytes == sample.disks["progress"].free_bytes
    assert sample.disks["proc"].free_bytes != sample.disks["output"].free_bytes


def proc_files_open_for(pids: set[int]) -> set[str]:
    """This process's descriptors open on the /proc files of ``pids``."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            parts = target.split("/")
            if (
                len(parts) > 2
                and parts[1] == "proc"
                and parts[2].isdigit()
                and int(parts[2]) in pids
            ):
                found.add(target)
    return found


def test_files_kept_open_give_the_same_figures_and_close_with_the_tree(
    spawn_tree: Callable[..., Tree],
) -> None:
    """The second reading (from files kept open) matches a plain reading by path; the files
    of processes that leave the tree, and all of them at close, are closed."""
    tree = spawn_tree(["idle"] * 6 + ["parent"])
    pids = tree.pids()
    # The two readings compare states: every process blocked in its read first (one that has
    # just said it is ready may still be running on a loaded machine).
    deadline = time.monotonic() + 10
    while any(psutil.Process(pid).status() != psutil.STATUS_SLEEPING for pid in pids):
        assert time.monotonic() < deadline, "the tree's processes did not block"
        time.sleep(0.01)
    sampler = ProcSampler(tree.pid)
    plain = ProcSampler(tree.pid)
    plain._open_files = None  # read by path, as on a fake /proc
    assert sampler.read(0.0) is not None
    assert proc_files_open_for(pids)  # kept open for the next reading

    kept, by_path = sampler.read(1.0), plain.read(1.0)
    assert kept is not None
    assert by_path is not None
    for figures in (kept, by_path):
        assert figures.pids == pids
    for pid, process in by_pid(kept).items():
        other = by_pid(by_path)[pid]
        assert (process.ppid, process.name, process.state, process.threads, process.fds) == (
            other.ppid,
            other.name,
            other.state,
            other.threads,
            other.fds,
        )
        assert (process.read_bytes, process.write_bytes) == (other.read_bytes, other.write_bytes)
        assert abs(process.rss_bytes - other.rss_bytes) <= MIB
    assert not proc_files_open_for({tree.pid})  # the root is not in the tree

    sampler.close()
    assert not proc_files_open_for(pids)
    assert sampler.read(2.0) is None  # closed: nothing is opened again
    assert not proc_files_open_for(pids)


def test_sleeping_processes_keep_their_figures_and_get_cmdlines_again_after_a_drop(
    spawn_tree: Callable[..., Tree],
) -> None:
    """Processes asleep across samples give the same figures each time (0 % CPU, no command
    line), and a dropped sample's command lines come again with the next one."""
    tree = spawn_tree(["idle"] * 4)
    idle = tree.pids("idle")
    sampler = ProcSampler(tree.pid)
    dropped = sampler.read(0.0)
    assert dropped is not None
    sampler.forget_descriptions(dropped)
    samples = [sampler.read(float(t)) for t in range(1, 4)]
    assert all(sample is not None for sample in samples)
    first, second, third = (by_pid(sample) for sample in samples if sample is not None)
    for pid in idle:
        assert first[pid].cmdline == by_pid(dropped)[pid].cmdline
        assert first[pid].cmdline
        assert second[pid] == third[pid]
        assert (third[pid].cpu_percent, third[pid].cmdline) == (0.0, None)
    sampler.close()


def test_files_of_processes_that_leave_the_tree_are_closed() -> None:
    with real_tree(["idle", "idle"]) as tree:
        outer = ProcSampler(tree.pid)
        assert outer.read(0.0) is not None
        assert len(proc_files_open_for(tree.pids())) >= 2
    # The tree has exited: the next reading finds nobody and keeps nothing open.
    assert outer.read(1.0) is not None
    assert not proc_files_open_for(tree.pids())
    outer.close()


def test_files_of_a_gone_process_are_never_read_as_the_pids_next_owner(
    spawn_tree: Callable[..., Tree],
) -> None:
    """A pid's kept files belong to the process they were opened for: once it is gone (its
    pid taken by another), reading them fails and the pid's files are opened afresh."""
    tree = spawn_tree(["idle", "idle"])
    sampler = ProcSampler(tree.pid)
    assert sampler.read(0.0) is not None
    open_files = sampler._open_files
    assert open_files is not None
    # A real pid reuse cannot be had on demand: give one member the files of a process that
    # has exited and been reaped, as its pid's files would be after the pid was reused.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    files = [
        os.open(f"/proc/{gone.pid}/{name}", os.O_RDONLY)
        for name in (
            "stat",
            "io",
            "fd",
            f"task/{gone.pid}/children",
            "schedstat",
            "statm",
            "status",
        )
    ]
    assert len(files) == FILES_PER_PROCESS
    gone.wait(timeout=10)
    member = min(tree.pids())
    open_files.drop(member)
    open_files.by_pid[member] = files

    sample = sampler.read(1.0)
    assert sample is not None
    assert sample.pids == tree.pids()
    figures = by_pid(sample)[member]
    assert figures.ppid == tree.pid
    assert figures.fds == psutil.Process(member).num_fds()
    assert not proc_files_open_for({gone.pid})  # the stale files were closed
    for fd in (fd for fd in open_files.by_pid[member] if fd >= 0):
        assert os.readlink(f"/proc/self/fd/{fd}").startswith(f"/proc/{member}/")
    sampler.close()


def test_processes_past_the_descriptor_budget_are_read_by_path(
    spawn_tree: Callable[..., Tree],
) -> None:
    """A budget of descriptors for two processes: the others are read the plain way."""
    tree = spawn_tree(["idle"] * 5)
    sampler = ProcSampler(tree.pid)
    sampler._open_files = OpenFiles("/proc", budget=8)
    for t in (0.0, 1.0):
        sample = sampler.read(t)
        assert sample is not None
        assert sample.pids == tree.pids()
        assert all(p.fds == psutil.Process(p.pid).num_fds() for p in sample.processes)
    assert len(proc_files_open_for(tree.pids())) <= 8
    sampler.close()


def test_with_a_members_file_the_tree_is_its_members(
    spawn_tree: Callable[..., Tree], tmp_path: Path
) -> None:
    """Given the tree's cgroup.procs, the sampler reads exactly its members (no children
    files); once that file is gone (the cgroup removed), the walk by children takes over."""
    tree = spawn_tree(["idle"] * 4 + ["parent"])
    members = sorted(tree.pids())[:3]
    procs = tmp_path / "cgroup.procs"
    procs.write_text("".join(f"{pid}\n" for pid in members))
    sampler = ProcSampler(tree.pid, members_file=str(procs))
    sample = sampler.read(0.0)
    assert sample is not None
    assert sample.pids == set(members)
    sampler.close()

    gone = ProcSampler(tree.pid, members_file=str(tmp_path / "removed" / "cgroup.procs"))
    sample = gone.read(0.0)
    assert sample is not None
    assert sample.pids == tree.pids()
    assert gone.members_file is None
    gone.close()


# A fake /proc --------------------------------------------------------------------------


@dataclass
class FakeProcess:
    pid: int
    start_ticks: int
    cpu_ticks: int = 0
    ppid: int = 1
    comm: str = "worker"
    state: str = "S"
    rss_pages: int = 256
    #: Of ``rss_pages``: file-backed and shared-memory pages (statm's "shared"), and of those
    #: the shared memory (status's RssShmem).
    shared_pages: int = 64
    shmem_pages: int = 0
    fds: int = 3
    children: list[int] = field(default_factory=list)
    cmdline: list[str] = field(default_factory=lambda: ["worker", "--fast"])


def fake_proc(proc: Path, root_pid: int, processes: list[FakeProcess]) -> None:
    """Write (or rewrite) a /proc holding ``root_pid`` and ``processes``."""
    proc.mkdir(exist_ok=True)
    (proc / "stat").write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 100 0 50 800 50 0 0 0 0 0\n")
    (proc / "meminfo").write_text(
        "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    600 kB\n"
        "SwapTotal:       200 kB\nSwapFree:        150 kB\n"
    )
    (proc / "loadavg").write_text("0.50 0.25 0.10 1/100 1234\n")
    top = [p.pid for p in processes if p.ppid == root_pid]
    children_file = proc / str(root_pid) / "task" / str(root_pid) / "children"
    children_file.parent.mkdir(parents=True, exist_ok=True)
    children_file.write_text(" ".join(map(str, top)) + " ")
    for p in processes:
        base = proc / str(p.pid)
        (base / "task" / str(p.pid)).mkdir(parents=True, exist_ok=True)
        (base / "fd").mkdir(exist_ok=True)
        for fd in range(p.fds):
            (base / "fd" / str(fd)).touch()
        # utime = cpu_ticks, stime = 0; fields after comm, from 3 (state) to 24 (rss).
        after = [p.state, p.ppid, p.pid, p.pid, 0, -1, 0, 0, 0, 0, 0, p.cpu_ticks, 0, 0, 0]
        after += [20, 0, 1, 0, p.start_ticks, 4096 * p.rss_pages, p.rss_pages, 0, 0]
        (base / "stat").write_text(f"{p.pid} ({p.comm}) " + " ".join(map(str, after)) + "\n")
        (base / "io").write_text(
            "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\n"
            "write_bytes: 8192\ncancelled_write_bytes: 0\n"
        )
        (base / "statm").write_text(f"1000 {p.rss_pages} {p.shared_pages} 10 0 500 0\n")
        (base / "status").write_text(
            f"Name:\t{p.comm}\nRssAnon:\t{4 * (p.rss_pages - p.shared_pages)} kB\n"
            f"RssFile:\t{4 * (p.shared_pages - p.shmem_pages)} kB\n"
            f"RssShmem:\t{4 * p.shmem_pages} kB\n"
        )
        (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in p.cmdline) + b"\0")
        (base / "task" / str(p.pid) / "children").write_text(" ".join(map(str, p.children)))


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_reused_pid_is_a_new_process_with_no_cpu_history(tmp_path: Path) -> None:
    """Same pid, new start time: no CPU delta against the old process, none negative."""
    clock = FakeClock(100.0)
    fake_proc(tmp_path, 1, [FakeProcess(200, start_ticks=10 * CLOCK_TICKS, cpu_ticks=5000)])
    sampler = ProcSampler(1, proc=tmp_path, clock=clock)
    first = sampler.read(0.0)
    assert first is not None

    # pid 200 exits; a new process gets pid 200, born at 100.5 s, and has run 0.2 s since.
    clock.now = 101.0
    reborn = FakeProcess(200, start_ticks=int(100.5 * CLOCK_TICKS), cpu_ticks=CLOCK_TICKS // 5)
    fake_proc(tmp_path, 1, [reborn])
    second = sampler.read(1.0)
    assert second is not None

    [process] = second.processes
    assert process.cpu_percent is None
    assert process.cmdline == ["worker", "--fast"]  # a new process is described again
    # All of the newcomer's 0.2 s fall in the 1 s window: the tree used 20 % of a core.
    assert second.tree.cpu_percent == pytest.approx(20.0)

    clock.now = 102.0
    fake_proc(tmp_path, 1, [FakeProcess(200, reborn.start_ticks, cpu_ticks=CLOCK_TICKS)])
    third = sampler.read(2.0)
    assert third is not None
    assert third.processes[0].cpu_percent == pytest.approx(80.0)
    assert third.tree.cpu_percent == pytest.approx(80.0)


def test_a_process_seen_late_gets_no_cpu_it_did_not_use_in_the_window(tmp_path: Path) -> None:
    """A process first seen now but born before the previous sample adds nothing to the tree."""
    clock = FakeClock(100.0)
    fake_proc(tmp_path, 1, [])
    sampler = ProcSampler(1, proc=tmp_path, clock=clock)
    assert sampler.read(0.0) is not None

    clock.now = 101.0
    fake_proc(tmp_path, 1, [FakeProcess(300, start_ticks=50 * CLOCK_TICKS, cpu_ticks=9999)])
    sample = sampler.read(1.0)

    assert sample is not None
    assert sample.processes[0].cpu_percent is None
    assert sample.tree.cpu_percent == 0.0


def test_processes_vanishing_mid_read_are_left_out(tmp_path: Path) -> None:
    """Listed but gone before its stat, or gone between two of its files: absent, no error."""
    whole = FakeProcess(203, start_ticks=1, children=[204], fds=2)  # 204 is listed, gone
    fake_proc(
        tmp_path, 1, [FakeProcess(201, start_ticks=1), FakeProcess(202, start_ticks=1), whole]
    )
    for name in ("stat", "io", "cmdline"):
        (tmp_path / "201" / name).unlink()
    (tmp_path / "202" / "io").unlink()

    sample = ProcSampler(1, proc=tmp_path).read(0.0)

    assert sample is not None
    assert sample.pids == {203}
    [process] = sample.processes
    assert (process.name, process.state, process.fds) == ("worker", "sleeping", 2)
    assert (process.read_bytes, process.write_bytes) == (4096, 8192)
    assert process.rss_bytes == 256 * PAGE_SIZE
    assert sample.machine.memory_used_bytes == 400 * 1024
    assert sample.machine.swap_percent == 25.0
    assert (sample.machine.load1, sample.machine.load15) == (0.5, 0.1)


def test_without_children_files_the_tree_comes_from_parent_pids(tmp_path: Path) -> None:
    """On a kernel without /proc/PID/task/TID/children every process's parent is scanned."""
    processes = [
        FakeProcess(201, 1, children=[202]),
        FakeProcess(202, 1, ppid=201),
        FakeProcess(301, 1, ppid=999),  # not in the tree
    ]
    fake_proc(tmp_path, 1, processes)
    for children in tmp_path.glob("*/task/*/children"):
        children.unlink()
    sampler = ProcSampler(1, proc=tmp_path)

    sample = sampler.read(0.0)

    assert not sampler.has_children_files
    assert sample is not None
    assert sample.pids == {201, 202}
    assert by_pid(sample)[202].ppid == 201


def test_notable_process_states_become_summary_labels(tmp_path: Path) -> None:
    """Processes in D, Z or T show up in summary_labels; only running and sleeping: none."""
    processes = [
        FakeProcess(201, 1, state="D"),
        FakeProcess(202, 1, state="Z"),
        FakeProcess(203, 1, state="R"),
    ]
    fake_proc(tmp_path, 1, processes)

    sample = ProcSampler(1, proc=tmp_path).read(0.0)

    assert sample is not None
    assert sample.summary_labels() == {"tree": {"process_states": ["disk-sleep", "zombie"]}}


def test_a_dropped_sample_gives_its_cmdlines_to_the_next_one(tmp_path: Path) -> None:
    """cmdline is sent once per process, again only if the sample carrying it was dropped."""
    fake_proc(tmp_path, 1, [FakeProcess(201, 1), FakeProcess(202, 1)])
    sampler = ProcSampler(1, proc=tmp_path)

    first = sampler.read(0.0)
    second = sampler.read(1.0)
    assert first is not None
    assert second is not None
    assert all(p.cmdline == ["worker", "--fast"] for p in first.processes)
    assert all(p.cmdline is None for p in second.processes)

    sampler.forget_descriptions(first)
    third = sampler.read(2.0)
    assert third is not None
    assert all(p.cmdline == ["worker", "--fast"] for p in third.processes)


def test_command_lines_are_masked(tmp_path: Path) -> None:
    """Secret values and URL passwords never leave the sampler in a command line."""
    argv = ["train", "--token=s3cr3t-value", "--db=postgres://me:hunter22@db/x", ""]
    fake_proc(tmp_path, 1, [FakeProcess(201, 1, cmdline=argv)])

    sample = ProcSampler(1, proc=tmp_path, masker=Masker(["s3cr3t-value"])).read(0.0)

    assert sample is not None
    assert sample.processes[0].cmdline == [
        "train",
        "--token=[redacted]",
        "--db=postgres://me:[redacted]@db/x",
        "",
    ]


def test_read_proc_file_reads_files_larger_than_one_read(tmp_path: Path) -> None:
    """A file larger than the buffer comes back whole, even when procfs gives a page a time."""
    content = b"1234 " * 5000
    (tmp_path / "children").write_bytes(content)
    assert read_proc_file(str(tmp_path / "children")) == content
    assert read_proc_file(str(tmp_path / "children"), one_piece=True) == content

    # Megabytes of small records, served a page per read(), like a long children file.
    symbols = Path("/proc/kallsyms")
    if not symbols.exists():
        pytest.skip("kernel without kallsyms")
    assert read_proc_file(str(symbols)) == symbols.read_bytes()


def test_next_tick_keeps_the_grid_and_skips_missed_ticks() -> None:
    """The next tick stays on start + k * interval, however long a read took."""
    assert next_tick(10.0, 1.0, now=10.2) == 11.0
    assert next_tick(10.0, 1.0, now=12.5) == 13.0
    assert next_tick(10.0, 1.0, now=11.0) == 12.0


@pytest.mark.asyncio
async def test_an_error_is_counted_each_time_and_noted_once(tmp_path: Path) -> None:
    """A failing step counts every time, is noted once, and sampling goes on."""
    fake_proc(tmp_path, 1, [FakeProcess(201, 1)])
    failures = [3]

    def broken(event: events.Event) -> None:
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("no tree for you")

    got = await collect(3, hook=broken, root_pid=1, proc=tmp_path)

    assert got.counters.sampler_errors >= 3
    [note] = got.of(events.SamplerNote)
    assert isinstance(note, events.SamplerNote)
    assert note.sampler == "proc"
    assert note.data["type"] == "RuntimeError"
    assert all(s.pids == {201} for s in got.samples)


@pytest.mark.asyncio
async def test_other_producers_events_waiting_drop_no_sample(tmp_path: Path) -> None:
    """A tick's progress, step and GPU events waiting beside it are no backlog: the sample is
    queued (it was dropped, and "the monitor fell behind" said, on a healthy machine); then,
    nobody receiving, the next samples find it waiting and are dropped."""
    fake_proc(tmp_path, 1, [FakeProcess(201, 1)])
    send, receive = open_event_queue(SoakClock(), buffer=64)
    offered, dropped = anyio.Event(), anyio.Event()

    class Counters(SinkCounters):
        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, value)
            if name == "dropped_samples" and value:
                dropped.set()

    sink = HookedSink(EventSink(send._send, send.clock, Counters()), lambda _: offered.set())
    for _ in range(3):
        await sink.emit(events.SamplerNote(t=0.0, sampler="gpu", message="waiting beside"))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(
                    run_proc_sampler, sink, root_pid=1, interval=0.05, disk_paths={}, proc=tmp_path
                )
            )
            await offered.wait()  # the first sample, queued behind three other events
            await dropped.wait()  # the next ones, 0.05 s apart, find it waiting
            tg.cancel_scope.cancel()
    async with receive:
        queued = [receive.receive_nowait() for _ in range(sink.waiting())]
    assert sum(isinstance(e, ProcSample) for e in queued) == 1


@pytest.mark.asyncio
async def test_a_sample_dropped_by_a_full_queue_is_counted(tmp_path: Path) -> None:
    """With no room in the queue the sample is dropped and its cmdlines go to the next one."""
    fake_proc(tmp_path, 1, [FakeProcess(201, 1)])
    full, receive = open_event_queue(SoakClock(), buffer=0)
    offered = anyio.Event()
    sink = HookedSink(full, lambda sample: offered.set())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(
                    run_proc_sampler,
                    sink,
                    root_pid=1,
                    interval=0.05,
                    disk_paths={},
                    proc=tmp_path,
                )
            )
            await offered.wait()  # nobody was receiving: that sample was dropped
            async with receive:
                delivered = await receive.receive()
            tg.cancel_scope.cancel()

    assert sink.counters.dropped_samples >= 1
    assert isinstance(delivered, ProcSample)
    assert delivered.processes[0].cmdline == ["worker", "--fast"]


@pytest.mark.asyncio
async def test_a_hung_read_degrades_the_sampler_until_it_returns(tmp_path: Path) -> None:
    """A read past its deadline is abandoned (degraded); sampling resumes when it returns."""
    fake_proc(tmp_path, 1, [FakeProcess(201, 1)])
    stat = tmp_path / "201" / "stat"
    good_stat = stat.read_bytes()
    stat.unlink()
    os.mkfifo(stat)  # opening it for reading blocks until a writer comes

    def unblock() -> None:
        if not stat.is_fifo():
            return
        replacement = tmp_path / "stat.new"
        replacement.write_bytes(good_stat)
        try:
            writer = os.open(stat, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader waiting: nothing is stuck
            os.replace(replacement, stat)
            return
        os.replace(replacement, stat)
        os.write(writer, good_stat)
        os.close(writer)

    sink, receive = open_event_queue(SoakClock())
    posted: list[events.Event] = []
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    partial(
                        run_proc_sampler,
                        sink,
                        root_pid=1,
                        interval=0.05,
                        disk_paths={},
                        read_timeout=0.2,
                        proc=tmp_path,
                    )
                )
                async with receive:
                    async for event in receive:
                        posted.append(event)
                        if isinstance(event, events.SamplerDegraded):
                            assert sink.counters.sampler_errors == 1
                            unblock()
                        if isinstance(event, ProcSample):
                            tg.cancel_scope.cancel()
                            break
    finally:
        unblock()

    kinds = [type(e) for e in posted]
    assert kinds == [events.SamplerDegraded, events.SamplerRecovered, ProcSample]
    assert sink.counters.sampler_errors == 1
    sample = posted[-1]
    assert isinstance(sample, ProcSample)
    assert sample.pids == {201}


@pytest.mark.asyncio
async def test_interval_must_be_positive() -> None:
    """A zero interval is refused before anything is read."""
    sink, receive = open_event_queue(SoakClock())
    with receive, pytest.raises(ValueError, match="interval"):
        await run_proc_sampler(sink, root_pid=1, interval=0, disk_paths={})


@pytest.mark.asyncio
async def test_a_stall_is_called_at_its_deadline_while_the_ticks_read_hangs(
    tmp_path: Path,
) -> None:
    """A read of the tree that takes long (a fork bomb on a starved machine) must not hold
    up the stall rules: the trainer that makes no progress is failed at its deadline while
    the read is still stuck."""
    from asyncsoak._sampling._progress_rules import ProgressTracker
    from asyncsoak._sampling._watchdog import run_watchdog

    proc = tmp_path / "proc"
    fake_proc(proc, 1, [FakeProcess(201, 1)])
    stat = proc / "201" / "stat"
    progress = tmp_path / "progress"
    progress.mkdir()
    sink, receive = open_event_queue(SoakClock())
    tracker = ProgressTracker({}, startup_timeout=1.0, stale_after=0.5)
    failed: list[tuple[str, float]] = []
    samples: list[ProcSample] = []
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:

                async def drain() -> None:
                    async with receive:
                        async for event in receive:
                            if isinstance(event, events.RuleBroken):
                                failed.append((event.reason, event.t))
                                tg.cancel_scope.cancel()
                            if isinstance(event, ProcSample):
                                samples.append(event)
                                if len(samples) == 1:
                                    # From the next tick on, the read blocks in open(2)
                                    # until a writer comes; the scan is posted by then.
                                    stat.unlink()
                                    os.mkfifo(stat)

                async def watch(clone: EventSink) -> None:
                    async with clone:
                        await run_watchdog(
                            clone,
                            progress_dir=progress,
                            tracker=tracker,
                            ignore=frozenset,
                            scan_interval=0.1,
                            limiter=anyio.CapacityLimiter(1),
                        )

                tg.start_soon(drain)
                tg.start_soon(watch, sink.clone())
                tg.start_soon(
                    partial(
                        run_proc_sampler,
                        sink,
                        root_pid=1,
                        interval=0.1,
                        disk_paths={},
                        read_timeout=30.0,
                        proc=proc,
                    )
                )
    finally:
        # Let the stuck read go (ENXIO when nothing waits on the FIFO).
        with contextlib.suppress(OSError):
            os.close(os.open(stat, os.O_WRONLY | os.O_NONBLOCK))
    assert len(samples) == 1  # the reads after the first never came back
    [(reason, at)] = failed
    assert reason == "startup_timeout"
    assert at < 1.0 + 1.0, f"the stall was called at {at:.2f}s, its deadline was 1.0s"


@pytest.mark.asyncio
async def test_once_the_tree_is_gone_an_empty_tree_is_not_a_sample(tmp_path: Path) -> None:
    """A tick that comes after the reaper's last child went finds an empty tree: it is not
    offered as a sample (its 0 processes would end every series of the run) and the sampler
    ends; before the tree is gone, an empty tree is sampled as it is."""
    fake_proc(tmp_path, 1, [])
    for gone in (False, True):
        tree_gone = anyio.Event()
        if gone:
            tree_gone.set()
        # Without a sample, collect returns only because the sampler ended on its own.
        samples = (await collect(1, root_pid=1, proc=tmp_path, tree_gone=tree_gone)).samples
        assert [len(s.processes) for s in samples] == ([] if gone else [0])


#: A subreaper whose child ("middle") forks a leaf that sleeps for good and never runs again;
#: it prints "middle leaf" and reaps whatever comes.
REPARENTING_ROOT = r"""
import ctypes, os, signal
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
middle = os.fork()
if middle == 0:
    leaf = os.fork()
    if leaf == 0:
        signal.pause()
        os._exit(0)
    print(os.getpid(), leaf, flush=True)
    signal.pause()
    os._exit(0)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""


@pytest.mark.slow
def test_a_sleeping_process_shows_its_new_parent_within_a_full_read() -> None:
    """A process that has not run keeps what was read of it (one read instead of four), but
    what changes while it sleeps, its parent when that one dies, shows within
    FULL_READ_SECONDS of the sampler's clock, however far apart the samples are."""
    root = subprocess.Popen([sys.executable, "-c", REPARENTING_ROOT], stdout=subprocess.PIPE)
    try:
        assert root.stdout is not None
        middle, leaf = map(int, _read_line(root.stdout, 30).split())
        now = [0.0]
        sampler = ProcSampler(root.pid, clock=lambda: now[0])
        for t in range(3):
            now[0] = 2.0 * t  # samples 2 s apart
            sample = sampler.read(now[0])
            assert sample is not None
            assert by_pid(sample)[leaf].ppid == middle
        os.kill(middle, signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):  # reaped already
            psutil.Process(middle).wait(timeout=10)  # by the root: the leaf is its child now
        ppids = []
        for _ in range(math.ceil(FULL_READ_SECONDS / 2.0)):
            now[0] += 2.0
            sample = sampler.read(now[0])
            assert sample is not None
            assert sample.pids == {leaf}
            ppids.append(by_pid(sample)[leaf].ppid)
        assert ppids[-1] == root.pid, ppids
        sampler.close()
    finally:
        root.kill()
        root.wait(10)
        assert root.stdout is not None
        root.stdout.close()
        with contextlib.suppress(ProcessLookupError, UnboundLocalError):
            os.kill(leaf, signal.SIGKILL)


# Memory that can run out ---------------------------------------------------------------

# argv[1]: a file to map; argv[2]: its size in MiB.  Maps the file and reads every page (the
# page cache, file-backed: what an mmap'd dataset costs), allocates and writes 96 MiB of
# anonymous memory and maps 32 MiB of /dev/shm (shared memory), then says "ready".
MEMORY_KINDS = r"""
import mmap, os, sys
path, mib = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
total = sum(mapped[i] for i in range(0, len(mapped), 4096))
anonymous = bytearray(96 << 20)
anonymous[::4096] = b"\x01" * len(anonymous[::4096])
shm = f"/dev/shm/asyncsoak-test-{os.getpid()}"
fd = os.open(shm, os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 32 << 20)
shared = mmap.mmap(fd, 32 << 20)
os.unlink(shm)
shared[::4096] = b"\x01" * len(shared[::4096])
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_anonymous_and_shared_memory_is_told_from_file_backed_pages(tmp_path: Path) -> None:
    """A process that maps and reads a 256 MiB file has that much RSS, none of it memory that
    can run out; what it allocates and the shared memory it maps are (``anon_bytes``)."""
    data = tmp_path / "dataset.bin"
    with data.open("wb") as f:
        for _ in range(256):
            f.write(os.urandom(1 << 20))
    with subprocess.Popen(
        [sys.executable, "-c", MEMORY_KINDS, str(data), "256"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        sampler = ProcSampler(os.getpid())
        try:
            sample = sampler.read(time.monotonic())
        finally:
            sampler.close()
        status = Path(f"/proc/{child.pid}/status").read_text()
        child.stdin.close()
    assert sample is not None
    (process,) = [p for p in sample.processes if p.pid == child.pid]
    kib = {
        line.split(":")[0]: int(line.split()[1]) * 1024
        for line in status.splitlines()
        if line.startswith(("RssAnon", "RssShmem", "RssFile"))
    }
    assert process.rss_bytes >= (256 + 96 + 32) * MIB
    # The mapped file is in RSS, not in the memory that can run out.
    assert 128 * MIB <= process.anon_bytes < (96 + 32 + 64) * MIB
    assert abs(process.anon_bytes - (kib["RssAnon"] + kib["RssShmem"])) < 4 * MIB
    assert sample.tree.anon_bytes >= process.anon_bytes


def test_shared_memory_left_in_dev_shm_is_measured(tmp_path: Path) -> None:
    """Segments nobody maps any more still hold memory in /dev/shm: the machine's figure
    counts them."""
    before = ProcSampler(os.getpid())
    try:
        first = before.read(time.monotonic())
        segment = Path(f"/dev/shm/asyncsoak-test-{os.getpid()}")
        try:
            with segment.open("wb") as f:
                f.write(b"\x01" * (64 * MIB))
            second = before.read(time.monotonic())
        finally:
            segment.unlink()
    finally:
        before.close()
    assert first is not None
    assert second is not None
    assert first.machine.shm_used_bytes is not None
    assert second.machine.shm_used_bytes is not None
    assert second.machine.shm_used_bytes - first.machine.shm_used_bytes >= 60 * MIB
    assert second.series_points()["machine"]["shm_used_bytes"] == second.machine.shm_used_bytes
