"""Every view of a run states the same status, reason, step, loss and last progress: a corpus
of real short runs (pass, stall, frozen step, NaN, leak, crash, GPU fault, a rank's crash),
each read through the artifact, ``summary`` (text and JSON), the report's first screen,
``watch --once``, the live line's last frame, ``recover``, ``job N`` and the metrics textfile."""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from asyncsoak._contract import SoakStatus, epoch, exits
from asyncsoak._view._status import shown_status
from asyncsoak._view._training import loss_text, step_text

from .conftest import CLI_ENV, asyncsoak_cli, asyncsoak_main
from .gpu_support import install_fake_nvidia_smi
from .test_gpu_health import unique_bus_id

pytestmark = pytest.mark.slow

#: A trainer writing ``{"step", "loss"}`` lines; argv: mode, progress dir, GPU pid file,
#: fault file.  pass: 12 steps and exit 0; stall: 8 steps, then waits; frozen: the step stays
#: at 6 while its file grows; nan: the loss is NaN at step 6 only; leak: keeps 6 MiB a step;
#: crash: raises at step 6; gpu: an ECC fault from step 6 (the fake nvidia-smi's); rank: two
#: ranks (RANK in their environment), rank 1 raising at step 6.
TRAINER = """
import json, os, pathlib, subprocess, sys, time
mode, progress, pid_file, fault_file = sys.argv[1:5]
if mode == "rank" and "RANK" not in os.environ:
    ranks = [
        subprocess.Popen(
            [sys.executable, *sys.argv],
            env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"},
        )
        for r in range(2)
    ]
    while all(r.poll() is None for r in ranks):
        time.sleep(0.05)
    for r in ranks:
        if r.poll() is None:
            r.kill()
    sys.exit(max(r.wait() for r in ranks))
rank = int(os.environ.get("RANK", "0"))
os.makedirs(progress, exist_ok=True)
pathlib.Path(pid_file).write_text(str(os.getpid()))
keep = [bytearray(100 * 2**20)] if mode == "leak" else []
for step in range(12 if mode == "pass" else 400):
    if mode == "stall" and step == 8:
        time.sleep(60)
    if step == 6 and (mode == "crash" or (mode == "rank" and rank == 1)):
        raise RuntimeError(f"injected crash at step {step}")
    if step == 6 and mode == "gpu":
        # After the monitor's first, healthy reading (the fake's .seen file), 30 s at most.
        deadline = time.monotonic() + 30
        while not os.path.exists(fault_file + ".seen") and time.monotonic() < deadline:
            time.sleep(0.01)
        pathlib.Path(fault_file).write_text("ecc")
    if mode == "leak":
        keep.append(bytearray(6 * 2**20))
    loss = float("nan") if mode == "nan" and step == 6 else 2.0 / (step + 1)
    if rank == 0:
        with open(os.path.join(progress, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"step": min(step, 6) if mode == "frozen" else step, "loss": loss}))
            f.write("\\n")
    time.sleep(0.05 if mode in ("leak", "gpu") else 0.1)
"""
SHAPES = {
    "pass": (),
    "stall": ("--stale-progress", "1.5"),
    "frozen": ("--stale-progress", "1.5"),
    "nan": (),
    "leak": ("--leak-check", "fail", "--sample-interval", "0.05"),
    "crash": (),
    "gpu": (),
    "rank": (),
}
#: The shape also run as a queued job (``submit``, then ``worker --once``).
QUEUED = "nan"
#: A figure the views round to 0.1 s, against the artifact's.
SHOWN_SECONDS = 0.051


@dataclass
class Run:
    """One shape's soak: where it ran, its stderr (the live line) and its views' figures."""

    shape: str
    where: Path
    stderr: str

    @property
    def artifact(self) -> dict[str, Any]:
        return cast("dict[str, Any]", json.loads((self.where / "soak.json").read_text()))


def trainer(base: Path, mode: str, where: Path) -> list[str]:
    files = (where / "p", where / "gpu.pid", where / "fault")
    return [sys.executable, str(base / "train.py"), mode, *map(str, files)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every shape run at once through ``asyncsoak run`` (the live line's plain frames on
    stderr, a metrics textfile), and the queued shape through a worker beside them."""
    base = tmp_path_factory.mktemp("corpus")
    (base / "train.py").write_text(TRAINER)
    queue = base / "queue"
    queue.mkdir()
    submitted = asyncsoak_cli(
        *("submit", "--db", str(queue / "q.db"), "--max-attempts", "1", "--grace", "1"),
        *("--sample-interval", "0.25", "--progress-dir", str(queue / "p"), "--"),
        *trainer(base, QUEUED, queue),
        cwd=queue,
    )
    assert submitted.returncode == 0, submitted.stderr
    started: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    for shape, flags in SHAPES.items():
        where = base / shape
        (where / "metrics").mkdir(parents=True)
        env = dict(CLI_ENV)
        gpu: tuple[str, ...] = ("--no-gpu",)
        if shape == "gpu":
            smi = install_fake_nvidia_smi(
                where, pid_file=where / "gpu.pid", fault_file=where / "fault",
                bus_id=unique_bus_id()[0],
            )  # fmt: skip
            gpu = ("--nvidia-smi", str(smi.path))
            env.pop("CUDA_VISIBLE_DEVICES", None)
        argv = [
            *(sys.executable, "-m", "asyncsoak", "run", "--progress-dir", str(where / "p")),
            *("--output", str(where / "soak.json"), *gpu, "--sample-interval", "0.25"),
            *("--status-interval", "0.2", "--metrics-textfile", str(where / "metrics")),
            "--grace", "2", *flags, "--", *trainer(base, shape, where),
        ]  # fmt: skip
        with (where / "stderr.txt").open("wb") as err:
            started[shape] = subprocess.Popen(argv, cwd=where, env=env, stderr=err), where
    worker = [sys.executable, "-m", "asyncsoak", "worker", "--db", str(queue / "q.db"), "--once"]
    with (queue / "worker.txt").open("wb") as err:
        started["queued"] = (
            subprocess.Popen(
                [*worker, "--no-gpu", "--runs-dir", str(queue / "runs")],
                cwd=queue,
                env=CLI_ENV,
                stderr=err,
            ),
            queue,
        )
    for process, _ in started.values():
        process.wait(timeout=120)
    return {
        shape: Run(shape, where, (where / "stderr.txt").read_text())
        for shape, (_, where) in started.items()
        if shape != "queued"
    } | {"queued": Run("queued", queue, "")}


@dataclass(frozen=True)
class Figures:
    """What every view must say alike, as the artifact holds it."""

    status: str
    reason: str | None
    step: str
    loss: str
    #: Seconds into the run of the last progress (the step's last advance when steps count).
    last_progress: float
    started: float
    steps: dict[str, Any]


def figures(artifact: dict[str, Any]) -> Figures:
    progress = artifact["progress"]
    steps = progress["steps"]
    last = steps["last_step_at"] if progress["source"] == "steps" else progress["last_change_at"]
    started = epoch(artifact["started_at"])
    assert started is not None
    return Figures(
        status=shown_status(artifact["status"], len(artifact["warnings"])),
        reason=artifact["failures"][0]["reason"] if artifact["failures"] else None,
        step=step_text(steps),
        loss=loss_text(steps),
        last_progress=(epoch(last) or math.nan) - started,
        started=started,
        steps=steps,
    )


EXPECTED = {
    "pass": (SoakStatus.PASSED, None),
    "stall": (SoakStatus.FAILED, "stale_progress"),
    "frozen": (SoakStatus.FAILED, "stale_progress"),
    "nan": (SoakStatus.FAILED, "nonfinite_loss"),
    "leak": (SoakStatus.FAILED, "memory_leak"),
    "crash": (SoakStatus.FAILED, "nonzero_exit"),
    "gpu": (SoakStatus.FAILED, "gpu_fault"),
    "rank": (SoakStatus.FAILED, "nonzero_exit"),
}


def verdict_words(f: Figures) -> str:
    """``finished: failed (stale_progress)``, as the live line and ``watch`` end."""
    return f"finished: {f.status.replace('_', ' ')}" + (f" ({f.reason})" if f.reason else "")


def first_screen(html_text: str) -> str:
    """The report's text above its "Jump to:" links: the verdict banner and the evidence."""
    body = re.sub(r"<(script|style)\b.*?</\1>", "", html_text, flags=re.S)
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))
    return text[text.index("PASSED" if " PASSED " in text else "FAILED") :].split("Jump to:")[0]


def metrics(where: Path) -> dict[str, float]:
    """The textfile's samples, by name and labels without the soak id."""
    (path,) = (where / "metrics").glob("*.prom")
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[re.sub(r'soak_id="[^"]*",?', "", name).replace("{}", "")] = float(value)
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_view_states_the_same_figures(corpus: dict[str, Run], shape: str) -> None:
    """The status, reason, step, loss and last progress the artifact holds are what summary
    (text, JSON), the report's first screen, ``watch --once``, the live line's last frame,
    ``recover`` and the metrics textfile say."""
    run = corpus[shape]
    f = figures(run.artifact)
    assert (f.status.removesuffix("_with_warnings"), f.reason) == EXPECTED[shape], run.stderr
    assert f.step, f.steps
    assert f.loss, f.steps
    cli = {
        name: asyncsoak_main(*args, cwd=run.where)
        for name, args in {
            "summary": ("summary", "soak.json"),
            "json": ("summary", "--json", "soak.json"),
            "watch": ("watch", "--once", "soak.jsonl"),
            "report": ("report", "-o", "report.html", "soak.json"),
            "recover": ("recover", "-o", "recovered.json", "soak.jsonl"),
        }.items()
    }
    assert all(r.returncode == 0 for r in cli.values()), {k: r.stderr for k, r in cli.items()}
    last = f"{f.last_progress:.1f}s"
    # summary --json
    data = json.loads(cli["json"].stdout)
    assert data["status"] == f.status
    assert [r["reason"] for r in data["reasons"]][:1] == ([f.reason] if f.reason else [])
    assert step_text(data["progress"]["steps"]) == f.step
    assert loss_text(data["progress"]["steps"]) == f.loss
    assert abs(data["evidence"]["last_progress"]["t"] - f.last_progress) < 0.002
    # summary
    text = cli["summary"].stdout
    assert text.startswith(f.status.split("_")[0].upper() + ":"), text
    assert f.reason is None or f"  {f.reason} at " in text, text
    training = next(line for line in text.splitlines() if line.startswith("  training: "))
    assert f"{f.step}, " in training, training
    assert f.loss in training, training
    assert f"  last progress: {last}, " in text, text
    # the report's first screen
    screen = first_screen((run.where / "report.html").read_text())
    assert screen.startswith(f.status.split("_")[0].upper()), screen
    assert f.reason is None or f"{f.reason} at " in screen, screen
    assert f.step in screen, screen
    assert f.loss in screen, screen
    assert f"Last progress {last} (" in screen, screen
    # watch --once and the live line's last frame
    final = next(line for line in run.stderr.splitlines() if " finished: " in line)
    for frame in (cli["watch"].stdout, final):
        assert f" {verdict_words(f)} | {f.step}," in frame, frame
        assert f", {f.loss} | " in frame, frame
    # the live line's last running frame dates the last progress as the artifact does
    running = [
        (float(m["elapsed"]), float(m["age"]))
        for m in map(RUNNING.match, run.stderr.splitlines())
        if m is not None
    ]
    drawn = [(elapsed, age) for elapsed, age in running if elapsed >= f.last_progress + 0.1]
    assert drawn or shape not in ("stall", "frozen"), run.stderr
    if drawn:
        elapsed, age = drawn[-1]
        assert abs(elapsed - age - f.last_progress) <= 2 * SHOWN_SECONDS, (f, drawn[-1])
    # recover: the artifact rebuilt from the journal
    recovered = figures(json.loads((run.where / "recovered.json").read_text()))
    assert (recovered.status, recovered.reason) == (f.status, f.reason)
    assert (recovered.step, recovered.loss) == (f.step, f.loss)
    assert abs(recovered.last_progress - f.last_progress) < 0.002
    # the metrics textfile
    m = metrics(run.where)
    assert m[f'asyncsoak_soak_status{{status="{f.status.removesuffix("_with_warnings")}"}}'] == 1
    assert m["asyncsoak_soak_exit_code"] == exits.verdict_exit_code(
        run.artifact["status"], [f.reason] if f.reason else [], detailed=True
    )
    assert m["asyncsoak_step"] == f.steps["step"]
    # The metric is the newest finite loss (its contract): the views' "loss nan" is the
    # nonfinite_loss beside it.
    assert m["asyncsoak_loss"] == pytest.approx(f.steps["loss"])
    stamp = m["asyncsoak_progress_last_change_timestamp_seconds"]
    assert abs(stamp - f.started - f.last_progress) < 0.002, (stamp - f.started, f)


#: A running frame of the live line: its elapsed time and the age of the last progress.
RUNNING = re.compile(
    r"^asyncsoak: (?P<elapsed>[\d.]+)s running \| .*last progress (?P<age>[\d.]+)s ago"
)


def test_a_queued_jobs_view_states_its_runs_figures(corpus: dict[str, Run]) -> None:
    """``job N`` (text and JSON) states the status and reason of its run's artifact."""
    queue = corpus["queued"].where
    views = [
        asyncsoak_main("job", "--db", str(queue / "q.db"), *a, "1", cwd=queue)
        for a in ((), ("--json",))
    ]
    assert all(v.returncode == 0 for v in views), [v.stderr for v in views]
    data = json.loads(views[1].stdout)
    f = figures(json.loads(Path(data["artifact"]).read_text()))
    assert (f.status, f.reason) == EXPECTED[QUEUED]
    assert (data["status"], data["reason"]) == (f.status, f.reason)
    assert f"  status        {f.status} ({f.reason})\n" in views[0].stdout, views[0].stdout
