"""Several artifacts of one job (a SLURM job's tasks and restarts, or the soaks that shared a
torchrun rendezvous id) as one: each soak's verdict, which failed first and why, and when
each ran on one wall-clock axis (``summary`` and ``report`` given several artifacts)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._contract import Artifact, SoakStatus, format_duration, parse_iso_or_none, terminal_text
from .._process import judge_ranks, states_from_json
from ._evidence import last_progress_at
from ._sections import Recorded, host_probe, probes, stall_ranks, stop_section

#: Width of the text timeline's bars, in characters.
TIMELINE_WIDTH = 48
#: Statuses from worst to best: the job's verdict is the worst of its latest run.
_SEVERITY = (SoakStatus.ERROR, SoakStatus.FAILED, SoakStatus.CANCELLED, SoakStatus.PASSED)


class NotOneJobError(ValueError):
    """The artifacts given together are not all soaks of one scheduler job."""


@dataclass(frozen=True, slots=True)
class JobTask(Recorded):
    """One soak's place in its job: its SLURM task (a key missing from ``snapshot.scheduler``
    is null, as SLURM leaves a variable unset), or a torchrun job's host and lowest rank."""

    job_id: int | str | None = None
    cluster: str | None = None
    node: str | None = None
    rank: int | str | None = None
    local_rank: int | str | None = None
    num_tasks: int | str | None = None
    step_id: int | str | None = None
    restart_count: int | str | None = 0
    array_job_id: int | str | None = None
    array_task_id: int | str | None = None
    partition: str | None = None


@dataclass(frozen=True, slots=True)
class PodTask(Recorded):
    """The Kubernetes pod a soak ran in, and its place in its Job or JobSet."""

    pod_name: str | None = None
    namespace: str | None = None
    node: str | None = None
    job_name: str | None = None
    completion_index: int | str | None = None
    jobset_name: str | None = None
    replicated_job_name: str | None = None
    job_index: int | str | None = None


def scheduler_of(artifact: Artifact) -> JobTask | None:
    """The SLURM task a soak ran as; None outside a SLURM job."""
    task = JobTask.of(probes(artifact).scheduler or {})
    return task if task.job_id else None


def scheduler_line(artifact: Artifact) -> str | None:
    """``12 on node1 (rank 0 of 2, restart 1)`` for a soak that ran in a SLURM job."""
    s = scheduler_of(artifact)
    if s is None:
        return None
    job = str(s.job_id)
    if s.array_job_id is not None:
        job += f" (array {s.array_job_id}_{s.array_task_id})"
    details = []
    if s.rank is not None:
        of = f" of {s.num_tasks}" if s.num_tasks else ""
        details.append(f"rank {s.rank}{of}")
    if s.restart_count:
        details.append(f"restart {s.restart_count}")
    if s.partition:
        details.append(f"partition {s.partition}")
    return f"{job} on {s.node or '?'}" + (f" ({', '.join(details)})" if details else "")


def _ranks(artifact: Artifact) -> list[Any]:
    return list(artifact["ranks"]["ranks"]) if "ranks" in artifact else []  # a distributed run's


def rendezvous_of(artifact: Artifact) -> str | None:
    """The torchrun rendezvous id (``--rdzv-id``) a soak's ranks shared: a multi-node job's
    identity outside SLURM.  torchrun's default id, ``none``, names no job."""
    ids = {str(r["run_id"]) for r in _ranks(artifact) if r.get("run_id")}
    return ids.pop() if len(ids) == 1 and ids != {"none"} else None


def _rendezvous_task(artifact: Artifact) -> JobTask:
    """A soak of a torchrun job as the job view lists it: its host and its lowest rank."""
    host = host_probe(artifact)
    lowest = min(_ranks(artifact), key=lambda r: int(r["rank"]), default=None)
    return JobTask(
        node=None if host is None else host["hostname"],
        rank=None if lowest is None else lowest["rank"],
        local_rank=None if lowest is None else lowest["local_rank"],
    )


def pod_line(artifact: Artifact) -> str | None:
    """``ml/train-2-x7k2p on gpu-node-7 (job train, index 2)`` for a soak run in a pod."""
    scheduler = probes(artifact).scheduler
    if scheduler is None or scheduler["kind"] != "kubernetes":
        return None
    s = PodTask.of(scheduler)
    name = f"{s.namespace}/{s.pod_name}" if s.namespace else s.pod_name
    details = []
    if s.jobset_name:
        details.append(f"jobset {s.jobset_name}, {s.replicated_job_name} {s.job_index}")
    if s.job_name:
        details.append(f"job {s.job_name}")
    if s.completion_index is not None:
        details.append(f"index {s.completion_index}")
    where = f" on {s.node}" if s.node else ""
    return f"{name or '?'}{where}" + (f" ({', '.join(details)})" if details else "")


def combine(artifacts: Sequence[tuple[str, Artifact]]) -> dict[str, Any]:
    """One job's artifacts (``(path, artifact)`` pairs) as one JSON-ready view; raises
    :class:`NotOneJobError` when one ran outside a job, or they come from different jobs."""
    keys = set()
    for path, artifact in artifacts:
        s = scheduler_of(artifact)
        run_id = rendezvous_of(artifact)
        if s is not None:
            keys.add(("slurm", s.cluster, str(s.job_id)))
        elif run_id is not None:
            keys.add(("torchrun", None, run_id))
        else:
            raise NotOneJobError(
                f"{path} did not run inside a SLURM job nor a torchrun rendezvous with an id "
                "(--rdzv-id): summarise it alone"
            )
    if len(keys) != 1:
        jobs = ", ".join(sorted(job for _, _, job in keys))
        raise NotOneJobError(f"the artifacts come from different jobs ({jobs}): give one job's")
    kind, cluster, job_id = keys.pop()
    starts = [parse_iso_or_none(a["started_at"]) for _, a in artifacts]
    origin = min((t for t in starts if t is not None), default=None)

    def offset(text: object) -> float | None:
        moment = parse_iso_or_none(text)
        if moment is None or origin is None:
            return None
        return round((moment - origin).total_seconds(), 3)

    soaks: list[dict[str, Any]] = []
    for path, artifact in artifacts:
        s = scheduler_of(artifact) or _rendezvous_task(artifact)
        failures = artifact["failures"]
        first = failures[0] if failures else None
        stop = stop_section(artifact)
        soaks.append(
            {
                "path": path,
                "node": s.node,
                "rank": s.rank,
                "local_rank": s.local_rank,
                "step_id": s.step_id,
                "restart_count": s.restart_count or 0,
                "status": artifact["status"],
                "stop_cause": None if stop is None else stop["cause"],
                "reasons": [f["reason"] for f in failures],
                "first_failure": None
                if first is None
                else {
                    "reason": first["reason"],
                    "message": first["message"],
                    "at": first["at"],
                    "offset_seconds": offset(first["at"]),
                },
                "started_at": artifact["started_at"],
                "ended_at": artifact["ended_at"],
                "start_offset_seconds": offset(artifact["started_at"]),
                "end_offset_seconds": offset(artifact["ended_at"]),
                "duration_seconds": artifact["duration_seconds"],
                "returncode": artifact["exit"]["returncode"],
            }
        )
    soaks.sort(key=lambda x: (x["restart_count"], _rank_key(x["rank"]), x["path"]))
    failed = [x for x in soaks if x["first_failure"] is not None]
    first_failure = None
    if failed:
        earliest = min(failed, key=lambda x: _sort_time(x["first_failure"]["offset_seconds"]))
        first_failure = {
            "rank": earliest["rank"],
            "node": earliest["node"],
            "restart_count": earliest["restart_count"],
            "path": earliest["path"],
            **earliest["first_failure"],
        }
    latest = max(x["restart_count"] for x in soaks)
    statuses = [str(x["status"]) for x in soaks if x["restart_count"] == latest]
    status = min(statuses, key=lambda st: _SEVERITY.index(st) if st in _SEVERITY else 0)
    if (
        any(x["status"] in (SoakStatus.FAILED, SoakStatus.ERROR) for x in soaks)
        and status == SoakStatus.PASSED
    ):
        status = SoakStatus.FAILED
    return {
        "kind": kind,
        "cluster": cluster,
        "culprit": _culprit_across(soaks, artifacts),
        "first_stalled": _first_stalled(soaks, artifacts, offset),
        "job_id": int(job_id) if job_id.isdigit() else job_id,
        "status": status,
        "started_at": None if origin is None else origin.isoformat(),
        "soaks": soaks,
        "first_failure": first_failure,
        "nodes": sorted({str(x["node"]) for x in soaks if x["node"]}),
        "restarts": latest,
    }


def _latest_attempt(
    soaks: Sequence[Mapping[str, Any]], wanted: Callable[[Mapping[str, Any]], object]
) -> list[Mapping[str, Any]]:
    """The soaks ``wanted`` keeps of their latest attempt (restart): different attempts'
    stacks and progress are never judged together."""
    kept = [soak for soak in soaks if wanted(soak)]
    if not kept:
        return []
    latest = max(soak["restart_count"] for soak in kept)
    return [soak for soak in kept if soak["restart_count"] == latest]


def _culprit_across(
    soaks: Sequence[Mapping[str, Any]], artifacts: Sequence[tuple[str, Artifact]]
) -> dict[str, Any] | None:
    """The rank every node's ranks wait for, judged from all nodes' stall stacks together
    (a rank fine on its own node may be the one every other node waits for)."""
    by_path = dict(artifacts)

    def ranks_of(soak: Mapping[str, Any]) -> Any:
        ranks = stall_ranks(by_path[soak["path"]])
        return None if ranks is None else ranks["ranks"]

    states = []
    attempt = _latest_attempt(soaks, ranks_of)
    for soak in attempt:
        node = soak["node"]
        states.extend(states_from_json(ranks_of(soak), None if node is None else str(node)))
    culprit = judge_ranks(states)
    if culprit is None or culprit["text"] is None:
        return None
    return {**culprit, "restart_count": attempt[0]["restart_count"]}


def _first_stalled(
    soaks: Sequence[Mapping[str, Any]],
    artifacts: Sequence[tuple[str, Artifact]],
    offset: Any,
) -> dict[str, Any] | None:
    """The node whose progress stopped first on the wall clock, in the latest attempt."""
    by_path = dict(artifacts)
    stalled = []
    for soak in _latest_attempt(
        soaks, lambda soak: {"stale_progress", "startup_timeout"} & set(soak["reasons"])
    ):
        last = last_progress_at(by_path[soak["path"]])
        moment = parse_iso_or_none(last)
        if moment is not None:
            stalled.append((moment, soak, last))
    if not stalled:
        return None
    _, soak, last = min(stalled, key=lambda item: item[0])
    return {
        "node": soak["node"],
        "rank": soak["rank"],
        "restart_count": soak["restart_count"],
        "path": soak["path"],
        "last_progress_at": last,
        "offset_seconds": offset(last),
    }


def _rank_key(rank: object) -> tuple[int, str]:
    return (rank, "") if isinstance(rank, int) else (1 << 30, str(rank))


def _sort_time(value: float | None) -> float:
    return float("inf") if value is None else value


def soak_label(soak: Mapping[str, Any]) -> str:
    label = f"rank {soak['rank']}" if soak["rank"] is not None else "task ?"
    if soak["restart_count"]:
        label += f" restart {soak['restart_count']}"
    return label


def offset_text(value: float | None) -> str:
    return "?" if value is None else f"+{format_duration(value)}"


def format_combined(combined: Mapping[str, Any], *, width: int = TIMELINE_WIDTH) -> str:
    """The combined view as text safe to print: verdicts, the first failure, a timeline."""
    soaks = combined["soaks"]
    lines = [
        f"{combined['kind']} job {combined['job_id']}: {len(soaks)} soaks, {combined['status']} "
        f"(nodes: {', '.join(combined['nodes']) or '?'}"
        + (f"; {combined['restarts']} restart(s)" if combined["restarts"] else "")
        + ")"
    ]
    first = combined["first_failure"]
    if first is not None:
        label = soak_label(first)
        lines.append(
            f"  first failure: {label} on {first['node']} at {first['at']} "
            f"({offset_text(first['offset_seconds'])}): {first['reason']}: {first['message']}"
        )
    culprit = combined["culprit"]
    if culprit is not None:
        attempt = f" (restart {culprit['restart_count']})" if culprit["restart_count"] else ""
        lines.append(f"  culprit across the nodes{attempt}: {culprit['text']}")
    stalled = combined["first_stalled"]
    if stalled is not None:
        lines.append(
            f"  first to stop progressing: {stalled['node']} ({soak_label(stalled)}), last "
            f"progress at {stalled['last_progress_at']} ({offset_text(stalled['offset_seconds'])})"
        )
    labels = [soak_label(x) for x in soaks]
    pad = max(len(label) for label in labels)
    for label, soak in zip(labels, soaks, strict=True):
        why = ", ".join(soak["reasons"]) or f"stop: {soak['stop_cause']}"
        lines.append(
            f"  {label.ljust(pad)}  {soak['node']!s:<12} {str(soak['status']).upper():<9} "
            f"started {offset_text(soak['start_offset_seconds'])}, "
            f"ran {format_duration(float(soak['duration_seconds'] or 0))}, "
            f"exit {soak['returncode']}; {why}"
        )
    ends = [x["end_offset_seconds"] for x in soaks if x["end_offset_seconds"] is not None]
    span = max(ends, default=0.0)
    if span > 0:
        lines.append(
            f"timeline (wall clock, from {combined['started_at']}, {format_duration(span)} across):"
        )
        for label, soak in zip(labels, soaks, strict=True):
            lines.append(f"  {label.ljust(pad)}  |{_bar(soak, span, width)}|")
    for soak in soaks:
        lines.append(f"  {soak_label(soak)}: asyncsoak summary {soak['path']}")
    return terminal_text("\n".join(lines), one_line=False)


def _bar(soak: Mapping[str, Any], span: float, width: int) -> str:
    """``   =====X`` : when the soak ran on the job's time axis, X where it first failed."""
    start = soak["start_offset_seconds"] or 0.0
    end = soak["end_offset_seconds"] if soak["end_offset_seconds"] is not None else start
    cells = [" "] * width

    def cell(t: float) -> int:
        return min(width - 1, max(0, int(t / span * (width - 1))))

    for i in range(cell(start), cell(end) + 1):
        cells[i] = "="
    failure = soak["first_failure"]
    if failure is not None and failure["offset_seconds"] is not None:
        cells[cell(failure["offset_seconds"])] = "X"
    return "".join(cells)


def job_word(combined: Mapping[str, Any]) -> str:
    return "SLURM job" if combined["kind"] == "slurm" else "torchrun job"
