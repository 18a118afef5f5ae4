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
from asyncsoak._contract._redact import (
    REDACTED,
    Masker,
    argv_secrets,
    redact_env,
    redact_mapping,
    secret_values,
)
from asyncsoak._record._artifact_io import check_artifact

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
#: A presigned URL and an Azure connection string, under names that are no credential's.
URL_SIGNATURE = "plantedUrlSignature0040"
ACCOUNT_KEY = "plantedAccountKey0041=="
URLS = {
    "DATA_URL": f"https://b.s3.amazonaws.com/k?X-Amz-Date=1&X-Amz-Signature={URL_SIGNATURE}",
    "STORAGE": f"AccountName=a;AccountKey={ACCOUNT_KEY};EndpointSuffix=core.windows.net",
}
ALL_VALUES = [*SECRETS.values(), DB_PASSWORD, METADATA_SECRET, URL_SIGNATURE, ACCOUNT_KEY]

# A trainer that prints every secret it was given, then fails.
LEAKY_TRAINER = """
import os, pathlib, sys
URLS = ("DATA_URL", "STORAGE")
progress = pathlib.Path(os.environ["PROGRESS"])
progress.mkdir(parents=True, exist_ok=True)
(progress / "m.txt").write_text("step")
for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DATABASE_URL", *URLS):
    print(name, "=", os.environ[name], flush=True)
print("argv:", sys.argv[1:], flush=True)
sys.exit(3)
"""


def assert_no_secret(text: str, where: str) -> None:
    for value in ALL_VALUES:
        assert value not in text, f"{where} leaks {value!r}"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_artifact_journal_and_log_tail_never_hold_a_secret(tmp_path: Path) -> None:
    """Secrets in env, argv, metadata and the trainer's output are redacted or masked: in the
    artifact, the journal, the summary and the report (URL queries and connection strings
    too)."""
    from asyncsoak._view.report import write_report

    env = {
        **os.environ,
        **SECRETS,
        **URLS,
        "DATABASE_URL": DATABASE_URL,
        "PROGRESS": str(tmp_path / "progress"),
    }
    command = [*py(LEAKY_TRAINER), "--hf-token", SECRETS["HF_TOKEN"], URLS["DATA_URL"]]
    with anyio.fail_after(60), pytest.raises(SoakFailureError) as info:
        await run_soak(
            command=command,
            env=env,
            metadata={"run": "r1", "api_token": METADATA_SECRET, "store": URLS["STORAGE"]},
            **fast_limits(tmp_path),
        )
    artifact = info.value.artifact
    assert artifact["metadata"] == {
        "run": "r1",
        "api_token": "[redacted]",
        "store": "AccountName=a;AccountKey=[redacted];EndpointSuffix=core.windows.net",
    }
    assert "HF_TOKEN = [redacted]" in artifact["log"]["tail"]
    assert "X-Amz-Date=1&X-Amz-Signature=[redacted]" in artifact["log"]["tail"]
    assert "--hf-token" in artifact["command"]
    out = tmp_path / "out"
    write_report(check_artifact(artifact), out / "soak.html", source=str(out / "soak.json"))
    with anyio.fail_after(60):
        summary = await anyio.run_process(
            [sys.executable, "-m", "asyncsoak", "summary", str(out / "soak.json")], env=CLI_ENV
        )
    assert_no_secret((out / "soak.json").read_text(), "the artifact")
    assert_no_secret((out / "soak.jsonl").read_text(), "the journal")
    assert_no_secret((out / "soak.html").read_text(), "the report")
    assert_no_secret(summary.stdout.decode(), "the summary")
    for name in ("soak.json", "soak.jsonl", "soak.log"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600


@pytest.mark.slow
def test_queue_output_never_holds_a_secret(tmp_path: Path) -> None:
    """A failing job that printed its secrets: jobs, job, logs and JSON output mask them all."""
    db = tmp_path / "q.db"
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY_TRAINER)
    envs = [f"{k}={v}" for k, v in {**SECRETS, **URLS, "DATABASE_URL": DATABASE_URL}.items()]
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    outputs = run_once_and_view(db, job_id)
    assert "token [redacted]" in outputs["logs"]
    for where, text in outputs.items():
        assert_none_of([*ARGV_SECRETS.values(), *PRINTED_TOKENS], text, f"asyncsoak {where}")


#: One table of forms: (argument, what every view shows of it).  Overrides and options whose
#: name's last dotted component names a credential are redacted; hyper-parameters that merely
#: contain "token" or "key" in another sense are not.
ARGUMENT_FORMS = [
    ("db.password=hunter2-0013", "db.password=[redacted]"),
    ("+wandb.api_key=wk-0014", "+wandb.api_key=[redacted]"),
    ("++trainer.hf_token=hf-0015", "++trainer.hf_token=[redacted]"),
    ("hf_token=hf-0016", "hf_token=[redacted]"),
    ("HF_TOKEN=hf-0017", "HF_TOKEN=[redacted]"),
    ("servers[0].authToken=at-0018", "servers[0].authToken=[redacted]"),
    ("db/password=pw-0019", "db/password=[redacted]"),
    ("aws.secret_access_key=ak-0020", "aws.secret_access_key=[redacted]"),
    ("client.apiKey=ck-0021", "client.apiKey=[redacted]"),
    ("--foo.secret=fs-0022", "--foo.secret=[redacted]"),
    ("--wandb.api-key=wk-0023", "--wandb.api-key=[redacted]"),
    ("--token=tk-0024", "--token=[redacted]"),
    ("MYSQL_PWD=my-0025", "MYSQL_PWD=[redacted]"),
    ("lr=0.1", "lr=0.1"),
    ("tokenizer=gpt2", "tokenizer=gpt2"),
    ("model.tokenizer.name=gpt2", "model.tokenizer.name=gpt2"),
    ("max_tokens=5", "max_tokens=5"),
    ("data.num_tokens=2048", "data.num_tokens=2048"),
    ("maxNewTokens=4096", "maxNewTokens=4096"),
    ("token_budget=1000000", "token_budget=1000000"),
    ("password.min_length=12", "password.min_length=12"),
    ("pass_rate=0.95", "pass_rate=0.95"),
    ("--max-tokens=4096", "--max-tokens=4096"),
    ("--tokenizer=gpt2", "--tokenizer=gpt2"),
    ("https://example.com/?a=b", "https://example.com/?a=b"),
    ("PWD=/home/me", "PWD=/home/me"),
    ("TOKENIZERS_PARALLELISM=false", "TOKENIZERS_PARALLELISM=false"),
]


@pytest.mark.parametrize(("argument", "shown"), ARGUMENT_FORMS, ids=[a for a, _ in ARGUMENT_FORMS])
def test_each_argument_form_is_redacted_or_kept(argument: str, shown: str) -> None:
    """Each form as every view shows it, alone, and inside a ``sh -c`` command line; a redacted
    value is masked wherever else it appears, a kept one is left alone there too."""
    argv = ["python", "train.py", argument, "--echo", argument.partition("=")[2]]
    masker = Masker(argv_secrets(argv))
    redacted = shown != argument
    value = argument.partition("=")[2]
    assert masker.argv(argv)[:3] == ["python", "train.py", shown]
    assert masker.argv(argv)[4] == (REDACTED if redacted else value)
    inline = masker.argv(["sh", "-c", f"exec train.py {argument} --lr 0.1"])
    assert inline[2] == f"exec train.py {shown} --lr 0.1"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("AWS_ACCESS_KEY_ID", True),
        ("AWS_SESSION_TOKEN", True),
        ("PGPASSWORD", True),
        ("SENTRY_DSN", True),
        ("TRAINER__DB__PASSWORD", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("MAX_TOKENS", False),
        ("PWD", False),
        ("KEYBOARD_LAYOUT", False),
    ],
)
def test_environment_names_follow_the_same_rule(name: str, secret: bool) -> None:
    """Environment variables are judged by the same rule: a value whose name is secret-like is
    redacted and masked in free text, and ``TOKENIZERS_PARALLELISM=false`` does not mask every
    "false" of the log."""
    value = "value-0026"
    assert redact_env({name: value}) == {name: REDACTED if secret else value}
    assert Masker(secret_values({name: value}))(f"log: {value}") == (
        f"log: {REDACTED}" if secret else f"log: {value}"
    )


#: Credentials in URL queries and connection strings: (text, its secret, what stays).
QUERY_SECRETS = [
    ("https://h/x?token=tq-0031&page=2", "tq-0031", "page=2"),
    ("https://h/v1?api_key=ak-0032", "ak-0032", "https://h/v1?api_key="),
    (
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig=Az%2Bsig0033%3D",
        "Az%2Bsig0033%3D",
        "sv=2022-11-02&sp=r",
    ),
    (
        "https://b.s3.amazonaws.com/k?X-Amz-Date=20260101&X-Amz-Signature=ab0034cd",
        "ab0034cd",
        "X-Amz-Date=20260101",
    ),
    (
        "https://storage.googleapis.com/b/o?X-Goog-Signature=ef0035aa&X-Goog-Expires=900",
        "ef0035aa",
        "X-Goog-Expires=900",
    ),
    ("https://h/?access_token=at-0036#frag", "at-0036", "#frag"),
    (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFy0037==;EndpointSuffix=core.windows.net",
        "Zm9vYmFy0037==",
        "AccountName=acct;",
    ),
    (
        "BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig=ss0038",
        "ss0038",
        "BlobEndpoint=https://a.blob.core.windows.net/;",
    ),
    (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=sk0039=",
        "sk0039=",
        "SharedAccessKeyName=Root",
    ),
]


@pytest.mark.parametrize(("text", "secret", "kept"), QUERY_SECRETS, ids=range(len(QUERY_SECRETS)))
def test_url_query_and_connection_string_credentials_are_masked(
    text: str, secret: str, kept: str
) -> None:
    """A credential in a URL's query or a connection string is masked in free text (the log),
    in argv (alone and as ``--url=...``), in metadata, and as a value to mask elsewhere; the
    rest of the URL stays readable."""
    masker = Masker(secret_values({"STORAGE": text}))
    for shown in (
        masker(f"fetching {text} now"),
        *masker.argv(["train.py", text, f"--url={text}"]),
        redact_mapping({"source": text})["source"],
        masker(f"the bare value {secret} printed alone"),
    ):
        assert secret not in shown
    assert kept in masker(text)
    assert REDACTED in masker(text)


#: Overrides with secrets as a Hydra trainer takes them, and hyper-parameters that must stay.
OVERRIDE_SECRETS = {
    "db.password": "ovr-Planted-Password-0027",
    "+wandb.api_key": "ovr-Planted-ApiKey-0028",
    "hf_token": "ovr-Planted-HfToken-0029",
    "--foo.secret": "ovr-Planted-Flag-0030",
}
KEPT_OVERRIDES = ["lr=0.1", "tokenizer=gpt2", "max_tokens=5"]
OVERRIDES = [*(f"{k}={v}" for k, v in OVERRIDE_SECRETS.items()), *KEPT_OVERRIDES]
#: A trainer that prints its overrides, then fails.
OVERRIDE_TRAINER = """
import os, pathlib, sys
progress = pathlib.Path(os.environ["PROGRESS"])
progress.mkdir(parents=True, exist_ok=True)
(progress / "m.txt").write_text("step")
print("overrides:", " ".join(sys.argv[1:]), flush=True)
sys.exit(3)
"""


@pytest.mark.slow
@pytest.mark.asyncio
async def test_overrides_never_reach_artifact_journal_metrics_textfile_or_views(
    tmp_path: Path,
) -> None:
    """A soak of ``train.py db.password=X +wandb.api_key=Y hf_token=Z --foo.secret=V lr=0.1``
    that prints them: the artifact, the journal, the ``asyncsoak_soak_info`` label on
    /metrics, the textfile, the summary and the report hold none of X, Y, Z, V, and keep
    ``lr=0.1 tokenizer=gpt2 max_tokens=5``."""
    from asyncsoak import Metrics
    from asyncsoak._view.report import write_report

    from .metrics_support import free_port, samples, scrape_until, value

    script = tmp_path / "train.py"
    script.write_text(OVERRIDE_TRAINER)
    port = free_port()
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    env = {**os.environ, "PROGRESS": str(tmp_path / "progress")}
    result: dict[str, BaseException] = {}

    async def soak() -> None:
        try:
            # The script by its name in its own directory: the label is cut to 200
            # characters, and a long temporary path must not push the overrides out of it.
            await run_soak(
                command=[sys.executable, script.name, *OVERRIDES],
                cwd=tmp_path,
                env=env,
                metrics=Metrics(port=port, textfile_dir=textfiles, linger_seconds=30),
                **fast_limits(tmp_path),
            )
        except SoakFailureError as exc:
            result["failure"] = exc

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(soak)
            scraped = await scrape_until(
                port, lambda t: value(t, "asyncsoak_soak_status", status="failed") == 1
            )
    assert isinstance(result.get("failure"), SoakFailureError)
    out = tmp_path / "out"
    (textfile,) = textfiles.glob("*.prom")
    write_report(
        check_artifact(json.loads((out / "soak.json").read_text())),
        out / "soak.html",
        source=str(out / "soak.json"),
    )
    summary = await anyio.run_process(
        [sys.executable, "-m", "asyncsoak", "summary", str(out / "soak.json")],
        env=CLI_ENV,
        check=False,
    )
    label = samples(scraped)["asyncsoak_soak_info"][0][0]["command"]
    texts = {
        "the artifact": (out / "soak.json").read_text(),
        "the journal": (out / "soak.jsonl").read_text(),
        "/metrics": scraped,
        "the textfile": textfile.read_text(),
        "the summary": summary.stdout.decode(),
        "the report": (out / "soak.html").read_text(),
    }
    for where, text in texts.items():
        assert_none_of(list(OVERRIDE_SECRETS.values()), text, where)
    # The label is cut to 200 characters: the overrides come first.
    assert "db.password=[redacted] +wandb.api_key=[redacted] hf_token=[redacted]" in label
    assert "--foo.secret=[redacted]" in label
    artifact = json.loads(texts["the artifact"])
    assert artifact["command"][2:] == [
        *(f"{k}=[redacted]" for k in OVERRIDE_SECRETS),
        *KEPT_OVERRIDES,
    ]
    assert "lr=0.1 tokenizer=gpt2 max_tokens=5" in artifact["log"]["tail"]


@pytest.mark.slow
def test_queue_views_redact_overrides(tmp_path: Path) -> None:
    """A queued job with secret overrides that prints them: jobs, job, logs and their JSON hold
    none of the values, and keep the hyper-parameters."""
    db = tmp_path / "q.db"
    script = tmp_path / "train.py"
    script.write_text(OVERRIDE_TRAINER)
    submitted = cli(
        db, "submit", "--max-attempts", "1", "--sample-interval", "0.2",
        "--env", f"PROGRESS={tmp_path / 'progress'}", "--", sys.executable, str(script),
        *OVERRIDES,
    )  # fmt: skip
    job_id = submitted.stdout.strip()
    outputs = run_once_and_view(db, job_id)
    assert json.loads(outputs["job --json"])["status"] == "failed"
    assert "lr=0.1 tokenizer=gpt2 max_tokens=5" in outputs["logs"]
    assert "db.password=[redacted]" in outputs["job"]
    for where, text in outputs.items():
        assert_none_of(list(OVERRIDE_SECRETS.values()), text, f"asyncsoak {where}")


def run_once_and_view(db: Path, job_id: str) -> dict[str, str]:
    """One worker pass over the queue, then what each queue view prints of the job."""
    cli(db, "worker", "--once", "--no-gpu", "--poll", "0.2")
    return {
        "jobs": cli(db, "jobs").stdout,
        "jobs --json": cli(db, "jobs", "--json").stdout,
        "job": cli(db, "job", job_id).stdout,
        "job --json": cli(db, "job", job_id, "--json").stdout,
        "logs": cli(db, "logs", job_id).stdout,
    }
