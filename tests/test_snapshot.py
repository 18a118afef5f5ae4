"""The runtime snapshot: real git repositories, a fake nvidia-smi, real interpreters."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import asyncsoak
from asyncsoak._sampling._snapshot import collect_snapshot, command_interpreter, runtime_snapshot

from .gpu_support import install_fake_nvidia_smi

GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def git(repo: Path, *args: str) -> str:
    """Plain git, as a user would run it (nothing disabled)."""
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        env=GIT_ENV,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout


def make_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "train.py").write_text("print('training')\n")
    git(path, "add", "train.py")
    git(path, "commit", "-q", "-m", "first")
    return path


def quiet_snapshot(
    root: Path, *, command: list[str] | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """A snapshot with no GPU lookups (the GPU section is tested on its own)."""
    return collect_snapshot(
        root, command=command, env=env, nvidia_smi="asyncsoak-test-no-nvidia-smi"
    )


def test_clean_repository_revision_and_branch(tmp_path: Path) -> None:
    """A clean repository: its HEAD revision and branch, not dirty, no diff hash."""
    repo = make_repo(tmp_path / "repo")
    source = quiet_snapshot(repo)["source"]
    assert source["revision"] == git(repo, "rev-parse", "HEAD").strip()
    assert source["branch"] == "main"
    assert source["repository"] == str(repo.resolve())
    assert source["dirty"] is False
    assert source["diff_sha256"] is None
    assert source["errors"] == []


def test_editing_a_file_makes_the_repository_dirty(tmp_path: Path) -> None:
    """After an edit: dirty, `git diff HEAD` hashed; untracked files are counted apart."""
    repo = make_repo(tmp_path / "repo")
    (repo / "train.py").write_text("print('training, edited')\n")
    (repo / "notes.txt").write_text("not tracked\n")
    source = quiet_snapshot(repo)["source"]
    assert source["dirty"] is True
    assert (source["changed_files"], source["untracked_files"]) == (1, 1)
    diff = subprocess.run(
        ["git", "-C", str(repo), "diff", "HEAD", "--no-ext-diff", "--no-textconv", "--binary"],
        env=GIT_ENV,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    assert source["diff_sha256"] == hashlib.sha256(diff).hexdigest()


def test_a_detached_head_a_repository_without_commits_and_a_rename(tmp_path: Path) -> None:
    """A detached HEAD has a revision and no branch; a repository without commits has its
    branch and no revision; a staged rename is one changed file."""
    repo = make_repo(tmp_path / "repo")
    head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "--detach")
    git(repo, "mv", "train.py", "main.py")
    source = quiet_snapshot(repo)["source"]
    assert (source["revision"], source["branch"]) == (head, None)
    assert (source["dirty"], source["changed_files"], source["untracked_files"]) == (True, 1, 0)
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "trunk")
    (empty / "new.py").write_text("pass\n")
    source = quiet_snapshot(empty)["source"]
    assert (source["revision"], source["branch"]) == (None, "trunk")
    assert (source["changed_files"], source["untracked_files"]) == (0, 1)
    assert source["errors"] == []


def test_an_unreadable_index_still_gives_the_revision_and_branch(tmp_path: Path) -> None:
    """`git status` refused (a corrupt index): its error is recorded, and HEAD's revision and
    branch are still read."""
    repo = make_repo(tmp_path / "repo")
    head = git(repo, "rev-parse", "HEAD").strip()
    (repo / ".git" / "index").write_bytes(b"not an index")
    source = quiet_snapshot(repo)["source"]
    assert (source["revision"], source["branch"], source["dirty"]) == (head, "main", None)
    assert [e.split(":")[0] for e in source["errors"]] == ["git status"]


def test_directory_outside_git(tmp_path: Path) -> None:
    """A directory that is no repository says so instead of failing."""
    plain = tmp_path / "plain"
    plain.mkdir()
    assert quiet_snapshot(plain)["source"] == {
        "repository": None,
        "error": "not a git repository",
    }


def test_repository_cannot_run_code_in_the_monitor(tmp_path: Path) -> None:
    """fsmonitor, clean filter, external diff and textconv scripts of the repo never run."""
    repo = make_repo(tmp_path / "repo")
    ran = tmp_path / "ran"
    ran.mkdir()
    for name in ("fsmonitor", "clean", "extdiff", "textconv"):
        script = tmp_path / f"{name}.sh"
        script.write_text(f"#!/bin/sh\ntouch {ran / name}\ncat\n")
        script.chmod(0o755)
    (repo / ".gitattributes").write_text("*.py filter=evil diff=evil\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "attributes")
    git(repo, "config", "core.fsmonitor", str(tmp_path / "fsmonitor.sh"))
    git(repo, "config", "filter.evil.clean", str(tmp_path / "clean.sh"))
    git(repo, "config", "diff.evil.textconv", str(tmp_path / "textconv.sh"))
    git(repo, "config", "diff.external", str(tmp_path / "extdiff.sh"))
    (repo / "train.py").write_text("print('edited')\n")

    # Plain git runs every one of them: the protections below are what this test is about.
    git(repo, "status", "--porcelain")
    git(repo, "diff", "HEAD")
    git(repo, "diff", "HEAD", "--no-ext-diff")
    assert sorted(p.name for p in ran.iterdir()) == ["clean", "extdiff", "fsmonitor", "textconv"]
    for marker in ran.iterdir():
        marker.unlink()

    source = quiet_snapshot(repo)["source"]
    assert source["dirty"] is True
    assert source["diff_sha256"] is not None
    assert list(ran.iterdir()) == []


def test_callers_git_variables_do_not_redirect_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIT_DIR and GIT_EXTERNAL_DIFF of the monitor's environment are not passed to git."""
    repo = make_repo(tmp_path / "repo")
    other = make_repo(tmp_path / "other")
    (repo / "train.py").write_text("print('edited')\n")
    marker = tmp_path / "external-diff-ran"
    script = tmp_path / "extdiff.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", str(script))
    source = quiet_snapshot(repo)["source"]
    assert source["repository"] == str(repo.resolve())
    assert source["dirty"] is True
    assert not marker.exists()


def test_secrets_never_reach_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted HF_TOKEN and URL passwords appear nowhere in the snapshot's JSON."""
    secrets = {
        "HF_TOKEN": "hf_plantedtokenvalue123",
        "DATABASE_URL": "postgres://trainer:dbpassword456@db.internal/runs",
        "WANDB_BASE_URL": "https://me:wandbpassword789@wandb.internal",
        "NCCL_SOCKET_IFNAME": "eth0",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    planted = ("hf_plantedtokenvalue123", "dbpassword456", "wandbpassword789")
    for snapshot in (
        quiet_snapshot(tmp_path, env=dict(secrets)),
        runtime_snapshot(tmp_path),
    ):
        text = json.dumps(snapshot)
        assert not [s for s in planted if s in text]
        environment = snapshot["environment"]
        assert isinstance(environment, dict)
        assert environment["HF_TOKEN"] == "[redacted]"
        assert environment["WANDB_BASE_URL"] == "https://me:[redacted]@wandb.internal"
        assert environment["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert environment["NCCL_SOCKET_IFNAME"] == "eth0"


def test_missing_git_and_nvidia_smi_are_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without git or nvidia-smi on PATH the snapshot records it and still has every section."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    snapshot = runtime_snapshot(tmp_path)
    assert snapshot["source"] == {"repository": None, "error": "git not found"}
    assert snapshot["gpus"]["available"] is False
    assert "no GPU data" in snapshot["gpus"]["error"]
    assert snapshot["software"]["python"]["executable"] == sys.executable
    assert snapshot["host"]["cpu_count"] == os.cpu_count()


def test_gpu_section_comes_from_nvidia_smi(tmp_path: Path) -> None:
    """The GPU section is the inventory: names, driver and CUDA versions."""
    fake = install_fake_nvidia_smi(tmp_path, "idle")
    gpus = collect_snapshot(tmp_path, nvidia_smi=str(fake.path))["gpus"]
    assert gpus["available"] is True
    assert gpus["cuda_version"] == "13.0"
    assert [g["name"] for g in gpus["gpus"]] == ["NVIDIA H200"]


@pytest.mark.slow
def test_hung_nvidia_smi_does_not_hold_up_the_snapshot(tmp_path: Path) -> None:
    """A hung nvidia-smi costs the snapshot its deadline, then is recorded as an error."""
    fake = install_fake_nvidia_smi(tmp_path, "hang")
    # The fake never answers: a snapshot at all is the deadline at work.
    snapshot = collect_snapshot(tmp_path, nvidia_smi=str(fake.path), timeout=0.5)
    assert snapshot["gpus"]["available"] is False
    assert "no answer within 0.5 s" in snapshot["gpus"]["error"]


def test_the_commands_own_python_is_asked_for_its_packages(tmp_path: Path) -> None:
    """Another interpreter, named directly or by a script's #! line, reports its own packages."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    other = bindir / "python3"
    # Outside the virtual environment's directory, the same binary is another environment.
    other.symlink_to(os.path.realpath(sys.executable))
    launcher = bindir / "launch"
    launcher.write_text("#!/usr/bin/env python3\nprint('launching')\n")
    launcher.chmod(0o755)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    expected_prefix = subprocess.run(
        [str(other), "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    for command in ([str(other), "train.py"], ["launch", "--nproc", "2"]):
        assert command_interpreter(command, env) == str(other)
        software = quiet_snapshot(tmp_path, command=command, env=env)["software"]
        assert isinstance(software, dict)
        theirs = software["command_python"]
        assert theirs["executable"] == str(other)
        assert theirs["prefix"] == expected_prefix
        assert isinstance(theirs["distributions"], dict)
    assert command_interpreter([sys.executable, "train.py"], env) is None
    assert command_interpreter(["sh", "-c", "true"], env) is None
    assert command_interpreter(["no-such-command"], env) is None


def test_own_packages_are_recorded(tmp_path: Path) -> None:
    """This interpreter's installed distributions are listed with their versions."""
    software = quiet_snapshot(tmp_path)["software"]
    assert software["asyncsoak"] == asyncsoak.__version__
    assert "anyio" in {name.lower() for name in software["distributions"]}
    assert "command_python" not in software
    # Read from the directories' names: the names (in their normal form) and versions the
    # metadata gives.
    parsed: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        parsed.setdefault(name, dist.version)
    assert software["distributions"] == parsed


@pytest.mark.slow
def test_cli_prints_the_snapshot_as_json(tmp_path: Path) -> None:
    """`asyncsoak snapshot ROOT` prints the snapshot of ROOT as JSON."""
    repo = make_repo(tmp_path / "repo")
    fake = install_fake_nvidia_smi(tmp_path, "idle")
    done = subprocess.run(
        [sys.executable, "-m", "asyncsoak", "snapshot", str(repo), "--nvidia-smi", str(fake.path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    snapshot = json.loads(done.stdout)
    assert snapshot["source"]["revision"] == git(repo, "rev-parse", "HEAD").strip()
    assert snapshot["gpus"]["driver_version"] == "580.159.04"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the repository away")
def test_repository_of_another_user_is_refused_not_overridden(tmp_path: Path) -> None:
    """git's "dubious ownership" refusal is recorded as the source's error, not bypassed."""
    repo = make_repo(tmp_path / "repo")
    for path in [repo, *repo.rglob("*")]:
        os.lchown(path, 65534, 65534)
    source = quiet_snapshot(repo)["source"]
    assert source["repository"] is None
    assert "dubious ownership" in source["error"]
