"""Ranks and launchers of a distributed run, and which rank a stall is waiting on.

A rank is read from the rank variables of its ``/proc/PID/environ`` alone (no secret kept); a
launcher, known by its command line, is never blamed.  :func:`stall_culprit` names the ranks
whose py-spy stack is outside the collective the others wait in.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

#: The variables that say which rank a process is (rank, local rank, world size, group rank),
#: by family, the most specific first: under ``srun torchrun`` a worker holds both families'.
_RANK_KEYS = ("rank", "local_rank", "world_size", "group_rank")
RANK_VARIABLES: tuple[tuple[str, Mapping[str, str]], ...] = tuple(
    (family, dict(zip(_RANK_KEYS, names.split(), strict=False)))
    for family, names in (
        ("torch", "RANK LOCAL_RANK WORLD_SIZE GROUP_RANK"),
        ("openmpi", "OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_SIZE"),
        ("pmi", "PMI_RANK MPI_LOCALRANKID PMI_SIZE"),
        ("slurm", "SLURM_PROCID SLURM_LOCALID SLURM_NTASKS SLURM_NODEID"),
    )
)
_WANTED = frozenset(name.encode() for _, names in RANK_VARIABLES for name in names.values())
#: torchrun's rendezvous id (``--rdzv-id``): one job's ranks share it across its nodes.
RUN_ID_VARIABLE = b"TORCHELASTIC_RUN_ID"
_RUN_ID = re.compile(rb"[\w.:-]{1,128}")
#: Bytes of ``/proc/PID/environ`` read at most (a launcher appends the rank variables last).
ENVIRON_BYTES = 256 * 1024

#: Programs that launch ranks, by the base name of the program or script they run.
LAUNCHER_PROGRAMS: Mapping[str, str] = {
    "torchrun": "torchrun",
    "accelerate": "accelerate",
    "deepspeed": "deepspeed",
    "mpirun": "mpirun",
    "mpiexec": "mpirun",
    "orterun": "mpirun",
    "prterun": "mpirun",
    "srun": "srun",
}
#: ``python -m MODULE`` launchers.
LAUNCHER_MODULES: Mapping[str, str] = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "accelerate.commands.launch": "accelerate",
    "accelerate.commands.accelerate_cli": "accelerate",
    "deepspeed.launcher.runner": "deepspeed",
    "deepspeed.launcher.launch": "deepspeed",
}
#: The process name torchrun's elastic agent gives itself.
LAUNCHER_NAMES: Mapping[str, str] = {"pt_elastic": "torchrun"}
#: Shells and exec helpers that start a rank's program (``srun bash -c 'python train.py'``):
#: they hold the rank's variables too, but the rank runs in the process they start.
WRAPPER_NAMES = frozenset(
    {
        "sh",
        "bash",
        "dash",
        "zsh",
        "ksh",
        "env",
        "time",
        "timeout",
        "nice",
        "ionice",
        "nohup",
        "setsid",
        "stdbuf",
        "numactl",
        "taskset",
        "chrt",
    }
)
#: Processes whose role is kept at most (a rank's data-loader workers come and go each epoch).
MAX_ROLES = 4096


def parse_rank_environ(environ: bytes) -> dict[str, Any] | None:
    """The rank a process's environment (``/proc/PID/environ``) gives it, or None: only the
    rank variables are looked at, and only whole integers kept."""
    found: dict[str, int] = {}
    run_id: str | None = None
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name in _WANTED and value.isdigit() and len(value) < 10:
            found[name.decode()] = int(value)
        elif name == RUN_ID_VARIABLE and _RUN_ID.fullmatch(value):
            run_id = value.decode()
    for source, names in RANK_VARIABLES:
        if names["rank"] in found:
            rank: dict[str, Any] = {"rank": found[names["rank"]], "source": source}
            rank.update((key, found.get(names.get(key, ""))) for key in _RANK_KEYS[1:])
            if source == "torch" and run_id is not None:
                rank["run_id"] = run_id
            return rank
    return None


def read_environ(path: str) -> bytes:
    """At most ``ENVIRON_BYTES`` of an ``environ`` file (raises OSError as ``open`` does)."""
    with open(path, "rb") as f:
        return f.read(ENVIRON_BYTES)


def read_rank(environ: str) -> dict[str, Any] | None:
    """The rank an ``environ`` file gives its process; None when it has none or may not be
    read (another user's, or gone)."""
    try:
        return parse_rank_environ(read_environ(environ))
    except OSError:
        return None


def launcher_of(name: str, cmdline: Sequence[str] | None) -> str | None:
    """Which launcher a process is (``torchrun``, ``srun``...), from its name and arguments."""
    if name in LAUNCHER_NAMES:
        return LAUNCHER_NAMES[name]
    if not cmdline:
        return None
    program = os.path.basename(cmdline[0])
    if program in LAUNCHER_PROGRAMS or "python" not in program:
        return LAUNCHER_PROGRAMS.get(program)
    # python [options] (-m MODULE | SCRIPT) ...: the first argument that is not an option.
    rest = list(cmdline[1:])
    for index, arg in enumerate(rest):
        if arg == "-m" and index + 1 < len(rest):
            return LAUNCHER_MODULES.get(rest[index + 1])
        if arg.startswith("-m") and len(arg) > 2:
            return LAUNCHER_MODULES.get(arg[2:])
        if arg in ("-c", "-"):
            return None
        if not arg.startswith("-"):
            return LAUNCHER_PROGRAMS.get(os.path.basename(arg))
    return None


def role(name: str, cmdline: Sequence[str] | None, rank: Mapping[str, Any] | None) -> Any:
    """``{"launcher": "torchrun"}`` (whatever its environment says), its rank, or None."""
    launcher = launcher_of(name, cmdline)
    if launcher is not None:
        return {"launcher": launcher}
    return dict(rank) if rank is not None else None


def rank_leaders(processes: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """The process of each rank: of those holding one rank, the one whose parent does not (its
    data-loader workers inherit it), past the wrappers that started it."""
    by_pid = {int(p["pid"]): p for p in processes if p.get("pid") is not None}
    ranked = {pid: rank for pid, p in by_pid.items() if (rank := _rank_number(p)) is not None}
    ranked_children = {(int(by_pid[pid].get("ppid") or 0), rank) for pid, rank in ranked.items()}
    leaders: dict[int, Mapping[str, Any]] = {}
    for pid, rank in ranked.items():
        process = by_pid[pid]
        if _is_wrapper(process) and (pid, rank) in ranked_children:
            continue  # the rank runs in the process it started
        parent = by_pid.get(int(process.get("ppid") or 0))
        if parent is not None and _rank_number(parent) == rank and not _is_wrapper(parent):
            continue
        if rank not in leaders or pid < int(leaders[rank]["pid"]):
            leaders[rank] = process
    return dict(sorted(leaders.items()))


def _is_wrapper(process: Mapping[str, Any]) -> bool:
    return str(process.get("name") or "") in WRAPPER_NAMES


def _rank_number(process: Mapping[str, Any]) -> int | None:
    role = process.get("role")
    if not isinstance(role, Mapping) or "launcher" in role:
        return None
    rank = role.get("rank")
    return rank if isinstance(rank, int) else None


def ranks_section(
    roles: Mapping[int, Mapping[str, Any]], parents: Mapping[int, int], names: Mapping[int, str]
) -> dict[str, Any] | None:
    """The artifact's ``ranks``: each rank's process and the launchers; None without either."""
    if not roles:
        return None
    processes = [
        {"pid": pid, "ppid": parents.get(pid), "name": names.get(pid), "role": r}
        for pid, r in roles.items()
    ]
    return {
        "ranks": [
            {**dict(p["role"]), "pid": p["pid"], "name": names.get(int(p["pid"]))}
            for p in rank_leaders(processes).values()
        ],
        "launchers": [
            {"pid": pid, "name": names.get(pid), "launcher": r["launcher"]}
            for pid, r in sorted(roles.items())
            if "launcher" in r
        ],
    }


class RoleFold:
    """The role of each process of the tree, as the samples described it (when new or after an
    exec); at most MAX_ROLES, a gone process that inherited its parent's role forgotten."""

    __slots__ = ("names", "parents", "roles")

    def __init__(self) -> None:
        #: pid -> role of the processes that have one, and their parents and names.
        self.roles: dict[int, dict[str, Any]] = {}
        self.parents: dict[int, int] = {}
        self.names: dict[int, str] = {}

    def add(self, processes: Sequence[Mapping[str, Any]]) -> dict[int, float | None]:
        """Note each process's role as described; return each rank's CPU percent in this sample
        (its process and its workers; None when none has a figure), in the sample's order."""
        cpu: dict[int, float | None] = {}
        roles = self.roles
        for proc in processes:
            described = proc.get("role")
            if proc.get("cmdline") is not None or described:  # new, or after an exec
                pid = int(proc["pid"])
                if described:
                    if pid in roles or len(roles) < MAX_ROLES:
                        roles[pid] = dict(described)
                        self.parents[pid] = int(proc.get("ppid") or 0)
                        self.names[pid] = str(proc.get("name") or "?")
                elif roles.pop(pid, None) is not None:
                    del self.parents[pid], self.names[pid]
            if not roles:
                continue  # a tree without roles (most): nothing to sum
            role = roles.get(int(proc["pid"]))
            if role is not None and "rank" in role:
                rank = int(role["rank"])
                figure = proc.get("cpu_percent")
                if figure is None:
                    cpu.setdefault(rank, None)
                else:
                    cpu[rank] = (cpu.get(rank) or 0.0) + float(figure)
        if roles:
            alive = {int(proc["pid"]) for proc in processes}
            for pid in [p for p in roles if p not in alive and self._inherited(p)]:
                del self.roles[pid], self.parents[pid], self.names[pid]
        return cpu

    def is_rank(self, pid: int) -> bool:
        return "rank" in self.roles.get(pid, {})

    def _inherited(self, pid: int) -> bool:
        """Whether ``pid``'s role is its parent's (a rank's worker; not a wrapper's rank)."""
        ppid = self.parents.get(pid, 0)
        parent = self.roles.get(ppid)
        if parent is None or self.names.get(ppid) in WRAPPER_NAMES:
            return False
        return parent == self.roles.get(pid)

    def section(self) -> dict[str, Any] | None:
        """The artifact's ``ranks`` (see :func:`ranks_section`)."""
        return ranks_section(self.roles, self.parents, self.names)


_PY_SPY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^()]+):(?P<line>\d+)\)$")
#: Collective operations, named alike in torch.distributed, DeepSpeed and Megatron: a frame of
#: one of these names is a wait in a collective wherever it is.
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "inference_all_reduce",
        "barrier",
        "monitored_barrier",
        "broadcast",
        "broadcast_object_list",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_coalesced",
        "_all_gather_base",
        "allgather_fn",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "reduce_scatter_fn",
        "_reduce_scatter_base",
        "all_to_all",
        "all_to_all_single",
        "batch_isend_irecv",
        "reduce_from_tensor_model_parallel_region",
        "gather_from_tensor_model_parallel_region",
        "gather_from_sequence_parallel_region",
        "reduce_scatter_to_sequence_parallel_region",
    }
)
#: Names that are collectives only inside a communication library (a trainer's own
#: ``gather`` or ``wait`` is not): the backends' wait frames and the short verbs.
LIBRARY_COLLECTIVES = frozenset(
    {"reduce", "gather", "scatter", "send", "recv", "wait", "wait_tensor", "_wait_tensor"}
)
#: Path fragments of the communication libraries (py-spy shortens site-packages paths).
COMMUNICATION_PATHS = (
    "torch/distributed/",
    "deepspeed/comm/",
    "megatron/core/parallel_state",
    "megatron/core/tensor_parallel/",
)
#: Path fragments of installed code, passed over when naming where a rank stopped.
LIBRARY_PATHS = ("site-packages/", "dist-packages/", "/lib/python", "torch/", "threading.py")
_STOPPED = ("stopped", "tracing-stop")


def main_thread_frames(stack: str) -> list[tuple[str, str, int]]:
    """The (function, file, line) frames of the first thread of a ``py-spy dump``, innermost
    first."""
    frames: list[tuple[str, str, int]] = []
    in_thread = False
    for line in stack.splitlines():
        if line.startswith("Thread "):
            if in_thread:
                break
            in_thread = True
        elif in_thread and (match := _PY_SPY_FRAME.match(line)) is not None:
            frames.append((match["func"], match["file"], int(match["line"])))
    return frames


def collective_of(frames: Sequence[tuple[str, str, int]]) -> str | None:
    """The collective a stack waits in (the innermost one named), or None."""
    for func, file, _ in frames:
        name = func.rsplit(".", 1)[-1]
        if name in COLLECTIVES or (
            name in LIBRARY_COLLECTIVES and any(p in file for p in COMMUNICATION_PATHS)
        ):
            return name
    return None


def stopped_at(frames: Sequence[tuple[str, str, int]]) -> str | None:
    """Where a stack stands (``train.py:88 in load_batch``): its innermost frame of the
    trainer's own code, else its innermost."""
    own = [f for f in frames if not any(p in f[1] for p in LIBRARY_PATHS)]
    for func, file, line in (own or frames)[:1]:
        return f"{os.path.basename(file)}:{line} in {func}"
    return None


class RankState(NamedTuple):
    rank: int
    pid: int
    #: ``sleeping``, ``stopped`` (SIGSTOP), ``disk-sleep``...
    state: str
    collective: str | None
    #: Where it stands (``train.py:88 in load_batch``), when its stack is known.
    where: str | None
    #: Whether its stack is known (py-spy read it).
    has_stack: bool = True
    #: The node it ran on, when several nodes' soaks are judged together.
    node: str | None = None


def states_from_json(ranks: Iterable[Mapping[str, Any]], node: str | None) -> list[RankState]:
    """The rank states a soak's forensics recorded (``forensics.ranks.ranks``), on ``node``."""
    return [
        RankState(
            rank=int(r["rank"]),
            pid=int(r["pid"]),
            state=str(r.get("state") or "?"),
            collective=r.get("collective"),
            where=r.get("where"),
            has_stack=bool(r.get("has_stack", True)),
            node=node,
        )
        for r in ranks
    ]


def stall_culprit(processes: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Which rank(s) the others wait for, from the forensics' processes; None without ranks."""
    states = []
    for rank, process in rank_leaders(processes).items():
        dump = process.get("python_stack") or {}
        frames = main_thread_frames(str(dump.get("stack") or ""))
        state = str(process.get("state") or "?")
        where = stopped_at(frames)
        states.append(
            RankState(rank, int(process["pid"]), state, collective_of(frames), where, bool(frames))
        )
    return judge_ranks(states)


def judge_ranks(states: Sequence[RankState]) -> dict[str, Any] | None:
    """Which rank(s) the others wait for; None without ranks.  A culprit is stopped (SIGSTOP),
    outside any collective, or in another than most; all in one: none here (a hung
    communicator, a peer on another node); none in a known one: nothing concluded."""
    if not states:
        return None
    states = sorted(states, key=lambda s: s.rank)
    ranks = [{k: v for k, v in s._asdict().items() if k != "node"} for s in states]
    counts = Counter(s.collective for s in states if s.collective is not None)
    stopped = [s for s in states if s.state in _STOPPED]
    if not counts and not stopped:
        return {"culprits": [], "text": None, "waiting": None, "ranks": ranks}
    common = counts.most_common(1)[0][0] if counts else None
    culprits = [s for s in states if s in stopped or (s.has_stack and s.collective != common)]
    waiting = [s for s in states if s not in culprits and s.collective == common]
    listed = ", ".join(str(s.rank) for s in waiting)
    wait_text = (
        f"rank {listed} waits in {common}"
        if len(waiting) == 1
        else (f"ranks {listed} wait in {common}")
    )
    if culprits:
        text = "; ".join([*map(_culprit_text, culprits), *([wait_text] if waiting else [])])
    elif len(waiting) == len(states):
        text = f"every rank ({listed}) waits in {common}: a hung communicator, or a dead peer on "
        text += "another node"
    else:
        text = wait_text
    first = culprits[0] if culprits else None
    return {
        "culprits": [s.rank for s in culprits],
        "text": text,
        "waiting": common,
        "where": None if first is None else first.where,
        "pid": None if first is None else first.pid,
        "node": None if first is None else first.node,
        "ranks": ranks,
    }


def _culprit_text(state: RankState) -> str:
    node = f" on {state.node}" if state.node else ""
    head = f"rank {state.rank} (pid {state.pid}{node})"
    at = f" at {state.where}" if state.where else ""
    if state.state in _STOPPED:
        return f"{head} is stopped (SIGSTOP or a debugger){at}"
    if state.collective is not None:
        return f"{head} waits in {state.collective}{at}"
    return f"{head} stopped{at or ' outside any collective'}"
