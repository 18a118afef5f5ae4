"""Several artifacts of one job (a SLURM job's tasks and restarts, or the soaks that shared a
torchrun rendezvous id) as one: each soak's verdict, which failed first and why, and when
each ran on one wall-clock axis (``summary`` and ``report`` given several artifacts)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._contract import Artifact, SoakStatus, format_duration, parse_iso_or_none, terminal_text
from .._process import judge_ranks, states_from_json
from ._evidence import last_progress_at
from ._sections import host_probe, stall_ranks, stop_section

#: Width of the text timeline's bars, in characters.
TIMELINE_WIDTH = 48
#: Statuses from worst to best: the job's verdict is the worst of its latest run.
_SEVERITY = (SoakStatus.ERROR, SoakStatus.FAILED, SoakStatus.CANCELLED, SoakStatus.PASSED)


class NotOneJobError(ValueError):
    """The artifacts given together are not all soaks of one scheduler job."""


def _scheduler(artifact: Artifact) -> Mapping[str, Any]:
    """``snapshot.scheduler`` (any key may be missing, as SLURM leaves a variable unset)."""
    snapshot: Mapping[str, Any] = artifact["snapshot"]
    return snapshot.get("scheduler") or {}


def _slurm_task(artifact: Artifact) -> Mapping[str, Any] | None:
    task = _scheduler(artifact)
    return task if task.get("job_id") else None


def _details(*parts: tuple[object, str]) -> str:
    """`` (a, b)`` of the parts whose value is set; empty when none is."""
    shown = [text for value, text in parts if value]
    return f" ({', '.join(shown)})" if shown else ""


def scheduler_line(artifact: Artifact) -> str | None:
    """``12 on node1 (rank 0 of 2, restart 1)`` for a soak that ran in a SLURM job."""
    s = _slurm_task(artifact)
    if s is None:
        return None
    job = str(s["job_id"])
    if s.get("array_job_id") is not None:
        job += f" (array {s['array_job_id']}_{s.get('array_task_id')})"
    of = f" of {s['num_tasks']}" if s.get("num_tasks") else ""
    return f"{job} on {s.get('node') or '?'}" + _details(
        (s.get("rank") is not None, f"rank {s.get('rank')}{of}"),
        (s.get("restart_count"), f"restart {s.get('restart_count')}"),
        (s.get("partition"), f"partition {s.get('partition')}"),
    )


def _ranks(artifact: Artifact) -> list[Any]:
    return list(artifact["ranks"]["ranks"]) if "ranks" in artifact else []  # a distributed run's


def rendezvous_of(artifact: Artifact) -> str | None:
    """The torchrun rendezvous id (``--rdzv-id``) a soak's ranks shared: a multi-node job's
    identity outside SLURM.  torchrun's default id, ``none``, names no job."""
    ids = {str(r["run_id"]) for r in _ranks(artifact) if r.get("run_id")}
    return ids.pop() if len(ids) == 1 and ids != {"none"} else None


def _rendezvous_task(artifact: Artifact) -> dict[str, Any]:
    """A soak of a torchrun job as the job view lists it: its host and its lowest rank."""
    host = host_probe(artifact)
    lowest: Mapping[str, Any] = min(_ranks(artifact), key=lambda r: int(r["rank"]), default={})
    return {
        "node": None if host is None else host["hostname"],
        "rank": lowest.get("rank"),
        "local_rank": lowest.get("local_rank"),
    }


def pod_line(artifact: Artifact) -> str | None:
    """``ml/train-2-x7k2p on gpu-node-7 (job train, index 2)`` for a soak run in a pod."""
    s = _scheduler(artifact)
    if s.get("kind") != "kubernetes":
        return None
    name = f"{s.get('namespace')}/{s.get('pod_name')}" if s.get("namespace") else s.get("pod_name")
    where = f" on {s['node']}" if s.get("node") else ""
    jobset = f"jobset {s.get('jobset_name')}, {s.get('replicated_job_name')} {s.get('job_index')}"
    return f"{name or '?'}{where}" + _details(
        (s.get("jobset_name"), jobset),
        (s.get("job_name"), f"job {s.get('job_name')}"),
        (s.get("completion_index") is not None, f"index {s.get('completion_index')}"),
    )


def combine(artifacts: Sequence[tuple[str, Artifact]]) -> dict[str, Any]:
    """One job's artifacts (``(path, artifact)`` pairs) as one JSON-ready view; raises
    :class:`NotOneJobError` when one ran outside a job, or they come from different jobs."""
    keys = set()
    for path, artifact in artifacts:
        s, run_id = _slurm_task(artifact), rendezvous_of(artifact)
        if s is not None:
            keys.add(("slurm", s.get("cluster"), str(s["job_id"])))
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
        s = _slurm_task(artifact) or _rendezvous_task(artifact)
        failures = artifact["failures"]
        stop = stop_section(artifact)
        first = failures[0] if failures else None
        soaks.append(
            {
                "path": path,
                **{key: s.get(key) for key in ("node", "rank", "local_rank", "step_id")},
                "restart_count": s.get("restart_count") or 0,
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
    soaks.sort(
        key=lambda x: (
            x["restart_count"],
            (x["rank"], "") if isinstance(x["rank"], int) else (1 << 30, str(x["rank"])),
            x["path"],
        )
    )
    failed = [x for x in soaks if x["first_failure"] is not None]
    first_failure = None
    if failed:
        timed = [x for x in failed if x["first_failure"]["offset_seconds"] is not None]
        earliest = min(timed, key=lambda x: x["first_failure"]["offset_seconds"], default=failed[0])
        first_failure = {**_place(earliest), **earliest["first_failure"]}
    latest = max(x["restart_count"] for x in soaks)
    statuses = [str(x["status"]) for x in soaks if x["restart_count"] == latest]
    status = min(statuses, key=lambda st: _SEVERITY.index(st) if st in _SEVERITY else 0)
    if (
        any(x["status"] in (SoakStatus.FAILED, SoakStatus.ERROR) for x in soaks)
        and status == SoakStatus.PASSED
    ):
        status = SoakStatus.FAILED
    by_path = dict(artifacts)
    return {
        "kind": kind,
        "cluster": cluster,
        "culprit": _culprit_across(soaks, by_path),
        "first_stalled": _first_stalled(soaks, by_path, offset),
        "job_id": int(job_id) if job_id.isdigit() else job_id,
        "status": status,
        "started_at": None if origin is None else origin.isoformat(),
        "soaks": soaks,
        "first_failure": first_failure,
        "nodes": sorted({str(x["node"]) for x in soaks if x["node"]}),
        "restarts": latest,
    }


def _place(soak: Mapping[str, Any]) -> dict[str, Any]:
    return {key: soak[key] for key in ("rank", "node", "restart_count", "path")}


def _latest_attempt(
    soaks: Sequence[Mapping[str, Any]], wanted: Callable[[Mapping[str, Any]], object]
) -> list[Mapping[str, Any]]:
    """The soaks ``wanted`` keeps of their latest attempt (restart): different attempts'
    stacks and progress are never judged together."""
    kept = [soak for soak in soaks if wanted(soak)]
    latest = max((soak["restart_count"] for soak in kept), default=0)
    return [soak for soak in kept if soak["restart_count"] == latest]


def _culprit_across(
    soaks: Sequence[Mapping[str, Any]], by_path: Mapping[str, Artifact]
) -> dict[str, Any] | None:
    """The rank every node's ranks wait for, judged from all nodes' stall stacks together
    (a rank fine on its own node may be the one every other node waits for)."""

    def ranks_of(soak: Mapping[str, Any]) -> Any:
        ranks = stall_ranks(by_path[soak["path"]])
        return None if ranks is None else ranks["ranks"]

    attempt = _latest_attempt(soaks, ranks_of)
    states = [
        state
        for soak in attempt
        for state in states_from_json(
            ranks_of(soak), None if soak["node"] is None else str(soak["node"])
        )
    ]
    culprit = judge_ranks(states)
    if culprit is None or culprit["text"] is None:
        return None
    return {**culprit, "restart_count": attempt[0]["restart_count"]}


def _first_stalled(
    soaks: Sequence[Mapping[str, Any]],
    by_path: Mapping[str, Artifact],
    offset: Callable[[object], float | None],
) -> dict[str, Any] | None:
    """The node whose progress stopped first on the wall clock, in the latest attempt."""
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
        **_place(soak),
        "last_progress_at": last,
        "offset_seconds": offset(last),
    }


def soak_label(soak: Mapping[str, Any]) -> str:
    label = f"rank {soak['rank']}" if soak["rank"] is not None else "task ?"
    return label + (f" restart {soak['restart_count']}" if soak["restart_count"] else "")


def offset_text(value: float | None) -> str:
    return "?" if value is None else f"+{format_duration(value)}"


def format_combined(combined: Mapping[str, Any]) -> str:
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
        lines.append(
            f"  first failure: {soak_label(first)} on {first['node']} at {first['at']} "
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
    pad = max(map(len, labels))
    for label, soak in zip(labels, soaks, strict=True):
        why = ", ".join(soak["reasons"]) or f"stop: {soak['stop_cause']}"
        lines.append(
            f"  {label.ljust(pad)}  {soak['node']!s:<12} {str(soak['status']).upper():<9} "
            f"started {offset_text(soak['start_offset_seconds'])}, "
            f"ran {format_duration(float(soak['duration_seconds'] or 0))}, "
            f"exit {soak['returncode']}; {why}"
        )
    span = max((x["end_offset_seconds"] or 0.0 for x in soaks), default=0.0)
    if span > 0:
        lines.append(
            f"timeline (wall clock, from {combined['started_at']}, {format_duration(span)} across):"
        )
        lines += [
            f"  {label.ljust(pad)}  |{_bar(soak, span)}|"
            for label, soak in zip(labels, soaks, strict=True)
        ]
    lines += [f"  {soak_label(soak)}: asyncsoak summary {soak['path']}" for soak in soaks]
    return terminal_text("\n".join(lines), one_line=False)


def _bar(soak: Mapping[str, Any], span: float) -> str:
    """``   =====X`` : when the soak ran on the job's time axis, X where it first failed."""
    start = soak["start_offset_seconds"] or 0.0
    end = soak["end_offset_seconds"] if soak["end_offset_seconds"] is not None else start

    def cell(t: float) -> int:
        return min(TIMELINE_WIDTH - 1, max(0, int(t / span * (TIMELINE_WIDTH - 1))))

    cells = [" "] * TIMELINE_WIDTH
    cells[cell(start) : cell(end) + 1] = "=" * (cell(end) + 1 - cell(start))
    failure = soak["first_failure"]
    if failure is not None and failure["offset_seconds"] is not None:
        cells[cell(failure["offset_seconds"])] = "X"
    return "".join(cells)


def job_word(combined: Mapping[str, Any]) -> str:
    return "SLURM job" if combined["kind"] == "slurm" else "torchrun job"
