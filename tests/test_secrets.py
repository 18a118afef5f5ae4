"""Planted secrets never reach the artifact, the journal, or the queue's output."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import anyio
import pytest

from asyncsoak import SoakFailureError, run_soak

from .conftest import fast_limits, py
from .queue.test_queue_cli import cli

SECRETS = {
    "HF_TOKEN": "hf_plantedTokenValue0001",
    "WANDB_API_KEY": "wandb0123456789abcdef0123456789abcdef",
    "AWS_SECRET_ACCESS_KEY": "aws/Planted+Secret/Key/Value/0002",
}
DB_PASSWORD = "pg-Planted-Password-0003"
DATABASE_URL = f"postgresql://trainer:{DB_PASSWORD}@db.internal:5432/runs"
METADATA_SECRET = "planted-metadata-credential-0004"
ALL_VALUES = [*SECRETS.values(), DB_PASSWORD, METADATA_SECRET]

# A trainer that prints every secret it was given, then fails.
LEAKY_TRAINER = """
import os, pathlib, sys
progress = pathlib.Path(os.environ["PROGRESS"])
progress.mkdir(parents=True, exist_ok=True)
(progress / "m.txt").write_text("step")
for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DATABASE_URL"):
    print(name, "=", os.environ[name], flush=True)
print("argv:", sys.argv[1:], flush=True)
sys.exit(3)
"""


def assert_no_secret(text: str, where: str) -> None:
    for value in ALL_VALUES:
        assert value not in text, f"{where} leaks {value!r}"


@pytest.mark.asyncio
async def test_artifact_journal_and_log_tail_never_hold_a_secret(tmp_path: Path) -> None:
    """Secrets in env, argv, metadata and the trainer's output are redacted or masked."""
    env = {
        **os.environ,
        **SECRETS,
        "DATABASE_URL": DATABASE_URL,
        "PROGRESS": str(tmp_path / "progress"),
    }
    command = [*py(LEAKY_TRAINER), "--hf-token", SECRETS["HF_TOKEN"]]
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=command,
            env=env,
            metadata={"run": "r1", "api_token": METADATA_SECRET},
            **fast_limits(tmp_path),
        )
    artifact = info.value.artifact
    assert artifact["metadata"] == {"run": "r1", "api_token": "[redacted]"}
    assert "HF_TOKEN = [redacted]" in artifact["log"]["tail"]
    assert "--hf-token" in artifact["command"]
    out = tmp_path / "out"
    assert_no_secret((out / "soak.json").read_text(), "the artifact")
    assert_no_secret((out / "soak.jsonl").read_text(), "the journal")
    for name in ("soak.json", "soak.jsonl", "soak.log"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600


def test_queue_output_never_holds_a_secret(tmp_path: Path) -> None:
    """A failing job that printed its secrets: jobs, job, logs and JSON output mask them all."""
    db = tmp_path / "q.db"
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY_TRAINER)
    envs = [f"{k}={v}" for k, v in {**SECRETS, "DATABASE_URL": DATABASE_URL}.items()]
    submitted = cli(
        db,
        "submit",
        "--max-attempts",
        "1",
        "--sample-interval",
        "0.2",
        *(arg for e in envs for arg in ("--env", e)),
        "--env",
        f"PROGRESS={tmp_path / 'progress'}",
        "--",
        sys.executable,
        str(script),
        "--hf-token",
        SECRETS["HF_TOKEN"],
    )
    job_id = submitted.stdout.strip()
    cli(db, "worker", "--once", "--no-gpu", "--poll", "0.2")
    outputs = {
        "jobs": cli(db, "jobs").stdout,
        "jobs --json": cli(db, "jobs", "--json").stdout,
        "job": cli(db, "job", job_id).stdout,
        "job --json": cli(db, "job", job_id, "--json").stdout,
        "logs": cli(db, "logs", job_id).stdout,
        "workers": cli(db, "workers").stdout,
    }
    job = json.loads(outputs["job --json"])
    assert job["status"] == "failed"
    # The output really was there to leak: the trainer printed it and the error holds the tail.
    assert "HF_TOKEN = [redacted]" in outputs["logs"]
    for where, text in outputs.items():
        assert_no_secret(text, f"asyncsoak {where}")
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
