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
from asyncsoak._record._artifact import check_artifact

from .conftest import CLI_ENV, fast_limits, py
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


#: Credentials in argv, by option and inside a URL whose password holds a "/".
ARGV_SECRETS = {
    "--token=": "tok-Planted-Value-0005",
    "--password": "pw-Planted-Value-0006",
    "url": "pl/anted-0007",
}
#: Credential-shaped values a trainer prints (no variable or option names them).
PRINTED_TOKENS = [
    "hf_PlantedHuggingFaceToken000008",
    "AKIAPLANTED000000009",
    "ghp_PlantedGitHubToken0000000000000000010",
    "sk-PlantedOpenAIStyleKey00000011",
    "eyPlantedBearerToken.0012",
]
HANGING_TRAINER = """
import os, pathlib, sys, time
progress = pathlib.Path(os.environ["PROGRESS"])
progress.mkdir(parents=True, exist_ok=True)
(progress / "m.txt").write_text("step")
print("argv:", sys.argv[1:], flush=True)
for token in sys.stdin.readline().split():
    print("token", token, flush=True)
print("Authorization: Bearer " + os.environ["BEARER"], flush=True)
time.sleep(120)
"""


def argv_with_secrets() -> list[str]:
    return [
        f"--token={ARGV_SECRETS['--token=']}",
        "--password",
        ARGV_SECRETS["--password"],
        f"https://alice:{ARGV_SECRETS['url']}@host.internal/x",
    ]


def assert_none_of(values: list[str], text: str, where: str) -> None:
    for value in values:
        assert value not in text, f"{where} leaks {value!r}"


@pytest.mark.asyncio
async def test_hang_forensics_and_printed_tokens_never_hold_a_secret(tmp_path: Path) -> None:
    """A stalled trainer with credentials in argv that prints token-shaped values: forensics
    (cmdline, py-spy), the journal, the artifact, the summary and the report hold none."""
    from asyncsoak._view.report import write_report

    tokens = PRINTED_TOKENS[:-1]
    stdin = tmp_path / "stdin.txt"
    stdin.write_text(" ".join(tokens) + "\n")
    env = {**os.environ, "PROGRESS": str(tmp_path / "progress"), "BEARER": PRINTED_TOKENS[-1]}
    script = tmp_path / "hang.py"
    script.write_text(HANGING_TRAINER)
    command = [sys.executable, str(script), *argv_with_secrets()]
    limits = fast_limits(tmp_path, stale_progress_seconds=1.0, post_shutdown_grace_seconds=1.0)
    # The trainer reads its tokens from a file, so only what it prints carries them.
    command = ["sh", "-c", 'exec "$@" < "$STDIN"', "sh", *command]
    env["STDIN"] = str(stdin)
    with anyio.fail_after(90), pytest.raises(SoakFailureError) as info:
        await run_soak(command=command, env=env, **limits)
    artifact = info.value.artifact
    assert info.value.reason == "stale_progress"
    processes = artifact["forensics"]["processes"]
    cmdlines = [" ".join(p.get("cmdline") or []) for p in processes]
    assert any("--token=[redacted]" in c and "--password [redacted]" in c for c in cmdlines)
    assert "token [redacted]" in artifact["log"]["tail"]
    assert "Bearer [redacted]" in artifact["log"]["tail"]
    secrets = [*ARGV_SECRETS.values(), *PRINTED_TOKENS]
    out = tmp_path / "out"
    assert_none_of(secrets, (out / "soak.json").read_text(), "the artifact")
    assert_none_of(secrets, (out / "soak.jsonl").read_text(), "the journal")
    write_report(check_artifact(artifact), out / "soak.html", source=str(out / "soak.json"))
    assert_none_of(secrets, (out / "soak.html").read_text(), "the report")
    summary = await anyio.run_process(
        [sys.executable, "-m", "asyncsoak", "summary", str(out / "soak.json")],
        env=CLI_ENV,
        check=False,
    )
    assert_none_of(secrets, (summary.stdout + summary.stderr).decode(), "the summary")


def test_job_views_mask_argv_options_and_printed_tokens(tmp_path: Path) -> None:
    """A job with credentials in argv that prints token-shaped values: every queue view masks
    them (jobs, job, logs, JSON)."""
    db = tmp_path / "q.db"
    script = tmp_path / "leaky.py"
    script.write_text(
        "import sys\nprint('argv:', sys.argv[1:])\n"
        + "".join(f"print('token {t}')\n" for t in PRINTED_TOKENS[:-1])
        + f"print('Authorization: Bearer {PRINTED_TOKENS[-1]}')\nsys.exit(3)\n"
    )
    submitted = cli(
        db, "submit", "--max-attempts", "1", "--sample-interval", "0.2", "--",
        sys.executable, str(script), *argv_with_secrets(),
    )  # fmt: skip
    job_id = submitted.stdout.strip()
    cli(db, "worker", "--once", "--no-gpu", "--poll", "0.2")
    outputs = {
        "jobs": cli(db, "jobs").stdout,
        "jobs --json": cli(db, "jobs", "--json").stdout,
        "job": cli(db, "job", job_id).stdout,
        "job --json": cli(db, "job", job_id, "--json").stdout,
        "logs": cli(db, "logs", job_id).stdout,
    }
    assert "token [redacted]" in outputs["logs"]
    for where, text in outputs.items():
        assert_none_of([*ARGV_SECRETS.values(), *PRINTED_TOKENS], text, f"asyncsoak {where}")
