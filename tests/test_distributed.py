"""Distributed runs: the rank, never the launcher.

The real thing: ``torchrun`` (torch's CPU build, the gloo backend) with two ranks under
``asyncsoak run``; one rank raises, stops outside a collective while the other waits in
``all_reduce``, or is stopped by SIGSTOP.  The rules that read ranks, stacks and logs are also
held to small hand-made inputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from jsonschema import Draft202012Validator

from asyncsoak._analysis._trendwatch import TrendWatch
from asyncsoak._contract import events
from asyncsoak._contract._crash import describe_rank_crash, find_rank_exception
from asyncsoak._export._soak_metrics import SoakMetrics
from asyncsoak._process._ranks import (
    launcher_of,
    parse_rank_environ,
    ranks_section,
    stall_culprit,
)
from asyncsoak._record._artifact_io import check_artifact
from asyncsoak._view._job_view import NotOneJobError, combine, format_combined
from asyncsoak._view._summary import format_summary, summarize

from .conftest import assert_valid, asyncsoak_cli
from .torch_trainer import HANG_LINE, RAISE_LINE, TRAINER

#: Two ranks stepping on their own for 5 s after a barrier, rank 1 five times slower.
STRAGGLING_TRAINER = """\
import sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
until = time.monotonic() + 5
step = 0
while time.monotonic() < until:
    with open(f"{sys.argv[2]}/rank{rank}.log", "a") as f:
        f.write(f"step {step}\\n")
    step += 1
    time.sleep(0.02 if rank == 0 else 0.1)
"""


def _torchrun_soak(
    tmp_path: Path, mode: str, *extra: str, trainer: str = TRAINER, returncode: int = 1
) -> tuple[str, dict[str, Any]]:
    """``asyncsoak run -- torchrun --nproc-per-node 2 train.py MODE``: its verdict's line on
    stderr and its artifact."""
    (tmp_path / "train.py").write_text(trainer)
    progress = tmp_path / "progress"
    progress.mkdir()
    output = tmp_path / "out" / "soak.json"
    result = asyncsoak_cli(
        "run",
        "--quiet",
        "--no-gpu",
        "--progress-dir",
        str(progress),
        "--output",
        str(output),
        "--sample-interval",
        "0.25",
        "--grace",
        "2",
        *extra,
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "train.py",
        mode,
        str(progress),
        cwd=tmp_path,
        timeout=90,
    )
    assert result.returncode == returncode, result.stderr
    first = next(line for line in result.stderr.splitlines() if "soak" in line)
    return first, json.loads(output.read_text())


@pytest.mark.slow
def test_a_rank_raising_fails_the_soak_with_its_exception_rank_and_line(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """A rank's ValueError, its rank, pid, file and line lead the first line, not torchrun's
    ChildFailedError; the next step points at the trainer's line."""
    first, artifact = _torchrun_soak(tmp_path, "raise")
    rank1 = next(r for r in artifact["ranks"]["ranks"] if r["rank"] == 1)
    assert (
        f"nonzero_exit: the command exited with status 1: rank 1 (pid {rank1['pid']}) failed "
        f"first: ValueError: bad batch at step 3 on rank 1 (train.py:{RAISE_LINE})"
    ) in first
    assert "ChildFailedError" not in first
    assert "api.py" not in first
    assert artifact["exit"]["exception"]["rank"] == 1
    assert_valid(artifact, schema)
    summary = summarize(check_artifact(artifact))
    assert f"Fix the error at train.py:{RAISE_LINE}." in summary["evidence"]["next_steps"]
    assert summary["evidence"]["cause"].startswith("rank 1 (pid ")
    # Each rank and the launcher are known, in the ranks and in the per-process table.
    assert [(r["rank"], r["local_rank"], r["world_size"]) for r in artifact["ranks"]["ranks"]] == [
        (0, 0, 2),
        (1, 1, 2),
    ]
    assert [launcher["launcher"] for launcher in artifact["ranks"]["launchers"]] == ["torchrun"]
    roles = {p["pid"]: p.get("role") for p in artifact["processes"]}
    assert roles[rank1["pid"]]["rank"] == 1


@pytest.mark.slow
def test_a_rank_stopped_outside_a_collective_is_the_culprit_of_the_stall(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """Rank 1 stuck in its own load_batch while rank 0 waits in all_reduce: rank 1 with its
    frame leads the first line; the launcher is never named; the blocked ranks read idle."""
    # A stall of 4 samples (the busy/idle label needs two of them, late ones on a loaded
    # machine included): the last 10 samples also hold the ranks' work before it.
    first, artifact = _torchrun_soak(
        tmp_path, "hang", "--stale-progress", "4", "--sample-interval", "1"
    )
    rank1 = next(r for r in artifact["ranks"]["ranks"] if r["rank"] == 1)
    assert (
        f"stale_progress: rank 1 (pid {rank1['pid']}) stopped at train.py:{HANG_LINE} in "
        "load_batch; rank 0 waits in all_reduce; no progress for"
    ) in first
    launcher = artifact["ranks"]["launchers"][0]
    assert "pt_elastic" not in first
    assert str(launcher["pid"]) not in first
    assert_valid(artifact, schema)
    text = format_summary(summarize(check_artifact(artifact)))
    assert f"cause: rank 1 (pid {rank1['pid']}) stopped at train.py:{HANG_LINE}" in text
    assert "Look at rank 1 at train.py" in text
    # The busy/idle verdict is the ranks' own, judged over the stall alone, as the summary's.
    assert "the tree was idle (the ranks' CPU" in first
    assert "The process tree was idle while stalled" in text


@pytest.mark.slow
def test_a_rank_stopped_by_a_signal_is_the_culprit_of_the_stall(tmp_path: Path) -> None:
    """A rank frozen by SIGSTOP (a dead peer, as seen from the others) is named as stopped."""
    first, artifact = _torchrun_soak(tmp_path, "sigstop", "--stale-progress", "3")
    rank1 = next(r for r in artifact["ranks"]["ranks"] if r["rank"] == 1)
    assert f"stale_progress: rank 1 (pid {rank1['pid']}) is stopped (SIGSTOP" in first
    assert "rank 0 waits in all_reduce" in first
    assert "pt_elastic" not in first


@pytest.mark.slow
def test_a_rank_falling_behind_the_others_is_a_straggler(tmp_path: Path) -> None:
    """Rank 1 writing its progress at a fifth of rank 0's rate: a warning names it, with its
    rate against the median; the soak passes."""
    verdict, artifact = _torchrun_soak(
        tmp_path, "straggle", "--sample-interval", "0.1", trainer=STRAGGLING_TRAINER, returncode=0
    )
    assert artifact["status"] == "passed"
    [straggler] = artifact["stragglers"]
    assert straggler["rank"] == 1
    assert straggler["rate_per_minute"] < 0.5 * straggler["median_rate_per_minute"]
    [warning] = [w for w in artifact["warnings"] if "straggler" in w]
    assert warning.startswith("rank 1 is a straggler: its progress files grew ")
    assert "against the ranks' median" in warning
    assert "straggler" in verdict


# -- the rules, on small inputs ------------------------------------------------------------


def test_only_the_rank_variables_are_kept_from_an_environment() -> None:
    """Rank, local rank, world size and group rank are read; a secret beside them is not."""
    environ = b"\0".join(
        [b"HF_TOKEN=hf_secret", b"RANK=3", b"LOCAL_RANK=1", b"WORLD_SIZE=8", b"GROUP_RANK=1"]
    )
    rank = parse_rank_environ(environ)
    assert rank == {
        "rank": 3,
        "local_rank": 1,
        "world_size": 8,
        "group_rank": 1,
        "source": "torch",
    }
    assert "hf_secret" not in json.dumps(rank)
    # srun + torchrun: the worker's RANK wins over its node's SLURM_PROCID.
    both = parse_rank_environ(b"SLURM_PROCID=1\0SLURM_NTASKS=2\0RANK=5")
    assert both is not None
    assert both["rank"] == 5
    slurm = parse_rank_environ(b"SLURM_PROCID=1\0SLURM_NTASKS=2\0SLURM_LOCALID=0")
    assert slurm == {
        "rank": 1,
        "local_rank": 0,
        "world_size": 2,
        "group_rank": None,
        "source": "slurm",
    }
    assert parse_rank_environ(b"OMPI_COMM_WORLD_RANK=2\0")["source"] == "openmpi"  # type: ignore[index]
    assert parse_rank_environ(b"PMI_RANK=4\0")["rank"] == 4  # type: ignore[index]
    assert parse_rank_environ(b"RANK=abc\0PATH=/bin") is None


@pytest.mark.parametrize(
    ("name", "cmdline", "launcher"),
    [
        ("pt_elastic", ["python3", "/venv/bin/torchrun", "train.py"], "torchrun"),
        ("python3", ["python3", "-m", "torch.distributed.run", "train.py"], "torchrun"),
        ("accelerate", ["/venv/bin/accelerate", "launch", "train.py"], "accelerate"),
        ("deepspeed", ["python", "/venv/bin/deepspeed", "train.py"], "deepspeed"),
        ("mpirun", ["mpirun", "-n", "4", "python", "train.py"], "mpirun"),
        ("srun", ["srun", "-n", "2", "python", "train.py"], "srun"),
        ("python3", ["python3", "-u", "train.py"], None),
        ("python3", ["python3", "-c", "import torchrun"], None),
    ],
)
def test_launchers_are_recognised(name: str, cmdline: list[str], launcher: str | None) -> None:
    """torchrun, accelerate, deepspeed, mpirun and srun are launchers; a trainer is not."""
    assert launcher_of(name, cmdline) == launcher


def _rank(pid: int, rank: int, frames: list[str], state: str = "sleeping") -> dict[str, Any]:
    stack = f'Thread {pid} (idle): "MainThread"\n' + "".join(f"    {f}\n" for f in frames)
    return {
        "pid": pid,
        "ppid": 1,
        "state": state,
        "role": {"rank": rank, "local_rank": rank, "world_size": 4, "group_rank": 0},
        "python_stack": {"stack": stack},
    }


_ALL_REDUCE = [
    "all_reduce (torch/distributed/distributed_c10d.py:3252)",
    "train_step (train.py:40)",
]


def test_a_rank_in_another_collective_is_the_culprit() -> None:
    """Ranks in all_reduce, one in barrier (DeepSpeed's own names too): that one is named."""
    processes = [
        _rank(10, 0, _ALL_REDUCE),
        _rank(11, 1, ["all_reduce (deepspeed/comm/comm.py:120)", "step (engine.py:9)"]),
        _rank(12, 2, ["barrier (torch/distributed/distributed_c10d.py:4000)", "save (t.py:7)"]),
        _rank(13, 3, _ALL_REDUCE),
        {"pid": 9, "ppid": 1, "state": "sleeping", "role": {"launcher": "torchrun"}},
    ]
    culprit = stall_culprit(processes)
    assert culprit is not None
    assert culprit["text"] == (
        "rank 2 (pid 12) waits in barrier at t.py:7 in save; ranks 0, 1, 3 wait in all_reduce"
    )


def test_every_rank_in_one_collective_is_said_so() -> None:
    """Every rank in the same collective: no rank here is the culprit, and the line says so."""
    culprit = stall_culprit([_rank(10 + r, r, _ALL_REDUCE) for r in range(4)])
    assert culprit is not None
    assert culprit["culprits"] == []
    assert culprit["text"].startswith("every rank (0, 1, 2, 3) waits in all_reduce")


def test_no_collective_no_verdict() -> None:
    """No rank in a known collective (a DDP backward in C++, say): nobody is blamed."""
    frames = ["_engine_run_backward (torch/autograd/graph.py:825)", "step (train.py:3)"]
    culprit = stall_culprit([_rank(10, 0, frames), _rank(11, 1, frames)])
    assert culprit is not None
    assert culprit["text"] is None
    assert stall_culprit([{"pid": 5, "ppid": 1, "role": None}]) is None


def test_a_rank_data_loader_worker_is_not_a_rank_of_its_own() -> None:
    """A worker inherits its rank's environment: the rank is its topmost process, even where
    the worker's pid is the lower one (pids wrap)."""
    worker = {**_rank(5, 1, ["load_batch (train.py:9)"]), "ppid": 11}
    culprit = stall_culprit([_rank(10, 0, _ALL_REDUCE), _rank(11, 1, _ALL_REDUCE), worker])
    assert culprit is not None
    assert culprit["culprits"] == []


def test_a_rank_run_through_a_shell_is_its_python_process() -> None:
    """``srun bash -c 'python train.py'``, ``torchrun --no-python run.sh``: the shell holds the
    rank's variables too, but the rank is the Python process it started, named as the culprit;
    one waiting rank reads "waits"."""
    role = {"rank": 1, "local_rank": 1, "world_size": 2, "group_rank": 0}
    shell = {"pid": 11, "ppid": 1, "name": "bash", "state": "sleeping", "role": role}
    python = {**_rank(21, 1, ["load_batch (train.py:9)", "main (train.py:30)"]), "ppid": 11}
    culprit = stall_culprit([_rank(10, 0, _ALL_REDUCE), shell, {**python, "name": "python"}])
    assert culprit is not None
    assert culprit["text"] == (
        "rank 1 (pid 21) stopped at train.py:9 in load_batch; rank 0 waits in all_reduce"
    )
    section = ranks_section({11: role, 21: role}, {11: 1, 21: 11}, {11: "bash", 21: "python"})
    assert section is not None
    assert [(r["rank"], r["pid"]) for r in section["ranks"]] == [(1, 21)]
    # Without a rank outside the collective, one waiting rank is told in the singular.
    waiting = stall_culprit([_rank(10, 0, _ALL_REDUCE), {**shell, "ppid": 1}])
    assert waiting is not None
    assert waiting["text"] == "rank 0 waits in all_reduce"


def test_the_tee_prefixes_and_the_error_file_name_the_rank(tmp_path: Path) -> None:
    """``torchrun --tee`` prefixes and ``@record``'s error file (when the log lacks the
    traceback) both give the rank's own exception, never ChildFailedError."""
    tee = "\n".join(
        [
            "[default1]:[rank1]: Traceback (most recent call last):",
            '[default1]:[rank1]:   File "/w/train.py", line 10, in main',
            "[default1]:[rank1]:     raise ValueError('bad')",
            "[default1]:[rank1]: ValueError: bad",
            "[default0]:[rank0]: Traceback (most recent call last):",
            '[default0]:[rank0]:   File "/w/train.py", line 12, in main',
            "[default0]:[rank0]: RuntimeError: Connection closed by peer",
            "Traceback (most recent call last):",
            '  File "/v/torch/distributed/launcher/api.py", line 383, in launch_agent',
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        ]
    )
    crash = find_rank_exception(tee)
    assert crash is not None
    assert describe_rank_crash(crash) == "rank 1 failed first: ValueError: bad (train.py:10)"

    error_file = tmp_path / "error.json"
    stack = 'Traceback (most recent call last):\n  File "/w/train.py", line 7, in f\nKeyError: 3\n'
    error_file.write_text(
        json.dumps(
            {
                "message": {
                    "message": "KeyError: 3",
                    "extraInfo": {"py_callstack": stack, "timestamp": "0"},
                }
            }
        )
    )
    report = "\n".join(
        [
            "Root Cause (first observed failure):",
            "[0]:",
            "  rank      : 2 (local_rank: 0)",
            "  exitcode  : 1 (pid: 4242)",
            f"  error_file: {error_file}",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            "============================================================",
        ]
    )
    crash = find_rank_exception(report)
    assert crash is not None
    assert describe_rank_crash(crash) == "rank 2 (pid 4242) failed first: KeyError: 3 (train.py:7)"
    # Not a distributed run: no rank, and the plain crash reading stays in charge.
    assert (
        find_rank_exception(
            'Traceback (most recent call last):\n  File "t.py", line 1, in '
            "<module>\nValueError: x\n"
        )
        is None
    )


def test_each_rank_has_its_cpu_metric() -> None:
    """asyncsoak_rank_cpu_cores has one series per rank (a worker counts for its rank)."""
    metrics = SoakMetrics(soak_id="s", host="h")
    role = {"rank": 1, "local_rank": 1, "world_size": 2, "group_rank": 0, "source": "torch"}
    metrics.observe(
        {
            "kind": "sample",
            "t": 1.0,
            "points": {"tree": {}},
            "processes": [
                {
                    "pid": 5,
                    "cpu_percent": 50.0,
                    "cmdline": ["torchrun"],
                    "role": {"launcher": "torchrun"},
                },
                {"pid": 6, "cpu_percent": 100.0, "cmdline": ["python"], "role": role},
                {"pid": 7, "cpu_percent": 25.0, "cmdline": ["python"], "role": role},
            ],
        }
    )
    rows = {name: samples for name, _, _, samples in metrics.rows()}
    assert rows["asyncsoak_rank_cpu_cores"] == [
        ("asyncsoak_rank_cpu_cores", (("rank", "1"), ("soak_id", "s")), 1.25)
    ]
    assert rows["asyncsoak_ranks"][0][2] == 1.0
    # Reported later without a description, the processes keep their rank.
    metrics.observe(
        {
            "kind": "sample",
            "t": 2.0,
            "points": {"tree": {}},
            "processes": [{"pid": 6, "cpu_percent": 10.0}],
        }
    )
    rows = {name: samples for name, _, _, samples in metrics.rows()}
    assert rows["asyncsoak_rank_cpu_cores"][0][2] == pytest.approx(0.1)


def test_a_rank_restarted_after_thousands_of_workers_is_still_known() -> None:
    """Data-loader workers (they inherit their rank) come and go every epoch: once thousands
    have gone, a rank restarted by torchrun still has its CPU metric, its CPU is the ranks'
    CPU of the stall's verdict."""
    role = {"rank": 1, "local_rank": 1, "world_size": 2, "group_rank": 0, "source": "torch"}
    launcher = {"pid": 5, "ppid": 1, "cpu_percent": 1.0, "role": {"launcher": "torchrun"}}
    metrics = SoakMetrics(soak_id="s", host="h")
    watch = TrendWatch()
    rank = {"pid": 6, "ppid": 5, "cpu_percent": 1.0, "cmdline": ["python"], "role": role}
    for n in range(5000):
        worker = {"pid": 100 + n, "ppid": 6, "cpu_percent": 1.0, "cmdline": ["python"]}
        event = {
            "kind": "sample",
            "t": float(n),
            "tree": {"processes": 3, "cpu_percent": 3.0},
            "points": {"tree": {}},
            "processes": [launcher, rank, {**worker, "role": role}],
        }
        metrics.observe(event)
        watch.add_sample(float(n), cast(events.SampleJson, event))
        launcher = {k: v for k, v in launcher.items() if k != "role"}
        rank = {"pid": 6, "ppid": 5, "cpu_percent": 1.0}
    restarted = {"pid": 9000, "ppid": 5, "cpu_percent": 80.0, "cmdline": ["python"], "role": role}
    event = {
        "kind": "sample",
        "t": 5000.0,
        "tree": {"processes": 2, "cpu_percent": 81.0},
        "points": {"tree": {}},
        "processes": [launcher, restarted],
    }
    metrics.observe(event)
    watch.add_sample(5000.0, cast(events.SampleJson, event))
    rows = {name: samples for name, _, _, samples in metrics.rows()}
    assert rows["asyncsoak_rank_cpu_cores"][0][2] == pytest.approx(0.8)
    assert watch.recent_cpu[-1] == (5000.0, 80.0)
    assert watch.roles[9000]["rank"] == 1


def _node_soak(node: str, last_progress: str, ranks: list[dict[str, Any]]) -> Any:
    """The parts of one node's artifact that combine() reads: a stall with its ranks."""
    return {
        "status": "failed",
        "failures": [{"reason": "stale_progress", "message": "no progress", "at": None}],
        "started_at": "2026-01-01T00:00:00+00:00",
        "ended_at": "2026-01-01T00:05:00+00:00",
        "duration_seconds": 300.0,
        "exit": {"returncode": None},
        "stop": {"cause": "failure"},
        "progress": {"last_change_at": last_progress},
        "snapshot": {"scheduler": {"kind": "slurm", "job_id": 7, "node": node, "rank": 0}},
        "forensics": {"ranks": {"ranks": ranks}},
    }


def test_the_culprit_rank_is_named_across_the_nodes_of_a_job() -> None:
    """Each node's ranks judged together: rank 3 on n1 is the one every other rank waits for,
    and n1 stopped progressing first."""
    in_all_reduce = {"state": "sleeping", "collective": "all_reduce", "where": "t.py:5 in step"}
    n0 = _node_soak(
        "n0",
        "2026-01-01T00:03:00+00:00",
        [{"rank": 0, "pid": 10, **in_all_reduce}, {"rank": 1, "pid": 11, **in_all_reduce}],
    )
    n1 = _node_soak(
        "n1",
        "2026-01-01T00:02:30+00:00",
        [
            {"rank": 2, "pid": 10, **in_all_reduce},
            {
                "rank": 3,
                "pid": 11,
                "state": "sleeping",
                "collective": None,
                "where": "train.py:88 in load_batch",
            },
        ],
    )
    combined = combine([("n0.json", n0), ("n1.json", n1)])
    assert combined["culprit"]["text"] == (
        "rank 3 (pid 11 on n1) stopped at train.py:88 in load_batch; "
        "ranks 0, 1, 2 wait in all_reduce"
    )
    assert combined["first_stalled"]["node"] == "n1"
    text = format_combined(combined)
    assert "culprit across the nodes: rank 3 (pid 11 on n1)" in text
    assert "first to stop progressing: n1" in text


def test_the_culprit_across_nodes_is_judged_within_one_attempt_of_a_requeued_job() -> None:
    """A requeued job's soaks: the ranks' stacks of its first attempt and of its restart are
    never judged together; the latest attempt's stall names its culprit and its first node."""
    in_all_reduce = {"state": "sleeping", "collective": "all_reduce", "where": "t.py:5 in step"}
    in_load = {"state": "sleeping", "collective": None, "where": "train.py:88 in load_batch"}
    soaks = []
    for restart, culprit_node, minute in ((0, "n1", 2), (1, "n0", 4)):
        for node, first_rank in (("n0", 0), ("n1", 2)):
            stamp = f"00:0{minute}:{30 if node == culprit_node else 40}"
            artifact = _node_soak(
                node,
                f"2026-01-01T{stamp}+00:00",
                [
                    {
                        "rank": r,
                        "pid": 10 + r,
                        **(
                            in_load
                            if node == culprit_node and r == first_rank + 1
                            else in_all_reduce
                        ),
                    }
                    for r in (first_rank, first_rank + 1)
                ],
            )
            artifact["snapshot"]["scheduler"]["restart_count"] = restart
            soaks.append((f"{node}.{restart}.json", artifact))
    combined = combine(soaks)
    assert combined["culprit"]["text"] == (
        "rank 1 (pid 11 on n0) stopped at train.py:88 in load_batch; "
        "ranks 0, 2, 3 wait in all_reduce"
    )
    assert (combined["first_stalled"]["node"], combined["first_stalled"]["restart_count"]) == (
        "n0",
        1,
    )
    assert "culprit across the nodes (restart 1): rank 1 (pid 11 on n0)" in format_combined(
        combined
    )


def test_mpirun_tagged_output_names_the_rank() -> None:
    """``mpirun --tag-output`` lines (``[job,rank]<stderr>:``) attribute a traceback to its
    rank; a bracketed word of the trainer's own log (``[gpu0]:``) does not make a rank."""
    tagged = "\n".join(
        [
            "[1,3]<stderr>:Traceback (most recent call last):",
            '[1,3]<stderr>:  File "/w/train.py", line 21, in <module>',
            "[1,3]<stderr>:KeyError: 'labels'",
        ]
    )
    crash = find_rank_exception(tagged)
    assert crash is not None
    assert describe_rank_crash(crash) == "rank 3 failed first: KeyError: 'labels' (train.py:21)"
    assert find_rank_exception(tagged.replace("[1,3]<stderr>:", "[gpu0]: ")) is None


def test_a_rank_killed_by_a_signal_is_named_with_its_signal() -> None:
    """A rank that left no traceback (SIGKILL, the OOM killer): torchrun's report names it,
    and its signal is the cause, never ChildFailedError."""
    report = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/v/torch/distributed/launcher/api.py", line 383, in launch_agent',
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "Root Cause (first observed failure):",
            "[0]:",
            "  time      : 2026-12-02_00:40:38",
            "  host      : localhost",
            "  rank      : 1 (local_rank: 1)",
            "  exitcode  : -9 (pid: 4242)",
            "  error_file: <N/A>",
            "  traceback : Signal 9 (SIGKILL) received by PID 4242",
            "============================================================",
        ]
    )
    crash = find_rank_exception(report)
    assert crash is not None
    assert describe_rank_crash(crash) == (
        "rank 1 (pid 4242) failed first: SIGKILL: killed by SIGKILL (often the kernel's OOM killer)"
    )


def test_nodes_of_one_torchrun_rendezvous_are_one_job() -> None:
    """Outside SLURM (a JobSet, plain torchrun), the ranks' rendezvous id joins the nodes'
    soaks; torchrun's default id "none" joins nothing."""
    environ = b"RANK=2\0WORLD_SIZE=4\0TORCHELASTIC_RUN_ID=job-42\0"
    assert parse_rank_environ(environ) == {
        "rank": 2,
        "local_rank": None,
        "world_size": 4,
        "group_rank": None,
        "source": "torch",
        "run_id": "job-42",
    }
    soaks = []
    for node, first_rank, last_progress in (("a", 0, "00:03:00"), ("b", 2, "00:02:00")):
        artifact = _node_soak(node, f"2026-01-01T{last_progress}+00:00", [])
        del artifact["snapshot"]["scheduler"]
        artifact["snapshot"]["host"] = {"hostname": node}
        artifact["ranks"] = {
            "ranks": [
                {"rank": r, "pid": 10 + r, "run_id": "job-42", "local_rank": r - first_rank}
                for r in (first_rank, first_rank + 1)
            ]
        }
        soaks.append((f"{node}.json", artifact))
    combined = combine(soaks)
    assert (combined["kind"], combined["job_id"]) == ("torchrun", "job-42")
    assert [(s["node"], s["rank"]) for s in combined["soaks"]] == [("a", 0), ("b", 2)]
    assert combined["first_stalled"]["node"] == "b"
    assert format_combined(combined).startswith("torchrun job job-42: 2 soaks")
    for _, artifact in soaks:
        for rank in artifact["ranks"]["ranks"]:
            rank["run_id"] = "none"
    with pytest.raises(NotOneJobError, match="torchrun rendezvous"):
        combine(soaks)
