"""The runtime snapshot: where the code, the GPUs, the software and the environment stood.

Synchronous (the soak runs it in a thread); every external command runs under a deadline, and
``git`` may not run the repository's code.  How: docs/architecture.md, "The runtime snapshot".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._contract import VERSION, redact_env
from .._process import CommandResult, run_command_sync

#: ``platform.python_implementation()``'s names (that module costs the start 2 ms).
_IMPLEMENTATIONS = {"cpython": "CPython", "pypy": "PyPy", "ironpython": "IronPython"}
_IMPLEMENTATION = _IMPLEMENTATIONS.get(sys.implementation.name, sys.implementation.name)
#: Environment variables recorded by name...
ENVIRONMENT_NAMES = frozenset(
    {
        "PATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "TOKENIZERS_PARALLELISM",
    }
)
#: ...and by prefix (then redacted: credential-looking names and URL passwords).
ENVIRONMENT_PREFIXES: tuple[str, ...] = (
    "ACCELERATE_",
    "ASYNCSOAK_",
    "CUBLAS_",
    "CUDA_",
    "CUDNN_",
    "DEEPSPEED_",
    "HF_",
    "HUGGINGFACE_",
    "JAX_",
    "KMP_",
    "MKL_",
    "MLFLOW_",
    "NCCL_",
    "NVIDIA_",
    "OMP_",
    "OPENBLAS_",
    "PYTORCH_",
    "SLURM_",
    "TF_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "TRANSFORMERS_",
    "WANDB_",
    "XLA_",
)

_PYTHON_NAME = re.compile(r"(python|pypy)[0-9.]*")
# Run by the command's interpreter, which may be any Python 3.8+: standard library only.
_INTERPRETER_PROBE = """\
import json, os, platform, re, sys
dists = {}
for entry in sys.path:
    try:
        names = sorted(os.listdir(entry or "."))
    except OSError:
        continue
    for name in names:
        stem, dot, suffix = name.rpartition(".")
        dist, _, version = stem.partition("-")
        if dot and suffix in ("dist-info", "egg-info") and version:
            dists.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), version.split("-")[0])
print(json.dumps({
    "executable": sys.executable,
    "version": platform.python_version(),
    "implementation": platform.python_implementation(),
    "prefix": sys.prefix,
    "distributions": dict(sorted(dists.items())),
}))
"""


def runtime_snapshot(root: Path) -> dict[str, Any]:
    """Record source, GPU, software, and environment provenance."""
    return collect_snapshot(root)


def collect_snapshot(
    root: Path,
    *,
    command: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    nvidia_smi: str = "nvidia-smi",
    timeout: float = 10.0,
) -> dict[str, Any]:
    """The snapshot of ``root``'s source and of this machine for a run of ``command`` in ``env``
    (default: this process's); ``timeout`` bounds each external command."""
    root = Path(root)
    environ: Mapping[str, str] = os.environ if env is None else env
    return {
        "taken_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "root": str(root.absolute()),
        "source": _section(lambda: source_info(root, timeout)),
        "gpus": _section(lambda: gpu_section(nvidia_smi, timeout)),
        "software": _section(lambda: software_info(command, environ, timeout)),
        "host": _section(host_info),
        "environment": _section(lambda: environment_info(environ)),
    }


def _section(build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    # Best effort: a section that breaks is recorded as such; the others go on.
    try:
        return build()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def source_info(root: Path, timeout: float = 10.0) -> dict[str, Any]:
    """Revision, branch and dirtiness of the git repository containing ``root``; ``git`` is
    configured so that the repository cannot run code (no hooks, fsmonitor or filters)."""
    executable = shutil.which("git")
    if executable is None:
        return {"repository": None, "error": "git not found"}
    base = [executable, "--no-pager", "--no-optional-locks", "-c", "core.fsmonitor=false"]
    base += ["-c", "core.hooksPath=/dev/null", "-C", str(root)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", LC_ALL="C")

    def git(*args: str, consume: Callable[[bytes], None] | None = None) -> CommandResult:
        return run_command_sync([*base, *args], timeout=timeout, env=env, consume=consume)

    top = git("rev-parse", "--show-toplevel")
    if not top.ok:
        if "not a git repository" in top.stderr:
            return {"repository": None, "error": "not a git repository"}
        return {"repository": None, "error": f"git rev-parse: {_git_error(top)}"}
    # Blank every filter driver the repository's config defines.
    listed = git("config", "--get-regexp", r"^filter\..*\.(clean|smudge|process)$")
    keys = (line.split(" ", 1)[0] for line in listed.output.splitlines())
    for name in sorted({key[len("filter.") : key.rindex(".")] for key in keys}):
        for key in ("clean", "smudge", "process"):
            base[1:1] = ["-c", f"filter.{name}.{key}="]
        base[1:1] = ["-c", f"filter.{name}.required=false"]
    errors: list[str] = []
    status = git(
        "status",
        "--porcelain=v2",
        "--branch",
        "-z",
        "--untracked-files=normal",
        "--ignore-submodules=dirty",
    )
    revision = branch = changed = untracked = None
    if status.ok:  # HEAD's revision and branch too: one git run instead of three
        revision, branch, changed, untracked = _read_status(status.output)
    else:
        errors.append(f"git status: {_git_error(status)}")
        head = git("rev-parse", "--verify", "-q", "HEAD")
        revision = head.output.strip() if head.ok else None
        named = git("symbolic-ref", "--short", "-q", "HEAD")
        branch = named.output.strip() if named.ok else None
    diff_sha256 = None
    if changed and revision is not None:
        import hashlib  # here: its OpenSSL load is paid only for a changed tree

        digest = hashlib.sha256()
        diff = git(
            "diff",
            "HEAD",
            "--no-ext-diff",
            "--no-textconv",
            "--binary",
            "--ignore-submodules=dirty",
            consume=digest.update,
        )
        if diff.ok:
            diff_sha256 = digest.hexdigest()
        else:
            errors.append(f"git diff: {_git_error(diff)}")
    return {
        "repository": top.output.strip(),
        "revision": revision,
        "branch": branch,
        "dirty": None if changed is None else changed > 0,
        "changed_files": changed,
        "untracked_files": untracked,
        "diff_sha256": diff_sha256,
        "errors": errors,
    }


def _git_error(result: CommandResult) -> str:
    if result.error is not None:
        return result.error
    # git's own message comes first ("fatal: ..."); hints on how to fix it follow.
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    return lines[0] if lines else result.describe()


def _read_status(porcelain: str) -> tuple[str | None, str | None, int, int]:
    """HEAD's revision and branch (None: no commit yet, detached), tracked files changed and
    untracked files, from ``status --porcelain=v2 --branch -z``."""
    revision = branch = None
    changed = untracked = 0
    entries = iter(porcelain.split("\0"))
    for entry in entries:
        kind, _, rest = entry.partition(" ")
        if kind == "#":
            key, _, value = rest.partition(" ")
            if key == "branch.oid" and value != "(initial)":
                revision = value
            elif key == "branch.head" and value != "(detached)":
                branch = value
        elif kind == "?":
            untracked += 1
        elif kind in ("1", "2", "u"):
            changed += 1
            if kind == "2":
                next(entries, None)  # a rename or copy is followed by its source path
    return revision, branch, changed, untracked


def software_info(
    command: Sequence[str] | None, environ: Mapping[str, str], timeout: float = 10.0
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": {
            "version": sys.version.split()[0],  # platform.python_version()'s text
            "implementation": _IMPLEMENTATION,
            "executable": sys.executable,
            "prefix": sys.prefix,
        },
        "platform": _platform(),
        "asyncsoak": VERSION,
        "distributions": distributions(),
    }
    interpreter = command_interpreter(command, environ)
    if interpreter is not None:
        info["command_python"] = _interpreter_info(interpreter, environ, timeout)
    return info


def distributions(paths: Sequence[str] = ()) -> dict[str, str]:
    """Installed distributions and their versions, from their ``.dist-info`` (``.egg-info``)
    directories' names on ``paths`` (default: ``sys.path``), the first found winning; the
    names alone, as parsing every metadata file was most of the snapshot's time."""
    found: dict[str, str] = {}
    for entry in paths or sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            dist, _, version = stem.partition("-")
            if dot and suffix in ("dist-info", "egg-info") and version:
                found.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), version.split("-")[0])
    return dict(sorted(found.items()))


def gpu_section(nvidia_smi: str, timeout: float = 10.0) -> dict[str, Any]:
    """The GPUs and driver (:func:`gpu_inventory`); the GPU modules are imported only where
    ``nvidia_smi`` is found, so a machine without GPUs pays nothing for them."""
    executable = shutil.which(nvidia_smi)
    if executable is None:
        return {"available": False, "error": f"{nvidia_smi!r} not found: no GPU data"}
    from ._nvidia_smi import gpu_inventory

    return gpu_inventory(executable, timeout)


def _platform() -> str:
    """``platform.platform()``'s text from ``os.uname()``: that one runs ``uname -p``."""
    uname = os.uname()
    try:
        libc = "-with-" + os.confstr("CS_GNU_LIBC_VERSION").replace(" ", "")  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        libc = ""
    return f"{uname.sysname}-{uname.release}-{uname.machine}{libc}"


def command_interpreter(command: Sequence[str] | None, environ: Mapping[str, str]) -> str | None:
    """The Python interpreter ``command`` runs when it is not this one: ``command[0]`` itself,
    or the one its ``#!`` line names (``torchrun`` and other console scripts)."""
    if not command:
        return None
    path = environ.get("PATH", os.defpath)
    executable = shutil.which(command[0], path=path)
    if executable is None:
        return None
    if not _is_python(executable):
        executable = _shebang_interpreter(executable, path)
        if executable is None or not _is_python(executable):
            return None
    if os.path.abspath(executable) == os.path.abspath(sys.executable):
        return None
    return executable


def _is_python(path: str) -> bool:
    return _PYTHON_NAME.fullmatch(os.path.basename(path)) is not None


def _shebang_interpreter(script: str, path: str) -> str | None:
    try:
        with open(script, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(words[0], path=path) if words else None
    return words[0] if words else None


def _interpreter_info(
    interpreter: str, environ: Mapping[str, str], timeout: float
) -> dict[str, Any]:
    # cwd "/": with -c, the interpreter puts its working directory first on sys.path, and the
    # repository's own files must not shadow the standard library here.
    result = run_command_sync(
        [interpreter, "-c", _INTERPRETER_PROBE], timeout=timeout, env=environ, cwd="/"
    )
    if not result.ok:
        stderr = result.stderr.strip().splitlines()
        return {"executable": interpreter, "error": stderr[-1] if stderr else result.describe()}
    try:
        info: dict[str, Any] = json.loads(result.output)
    except ValueError:
        return {"executable": interpreter, "error": f"unreadable answer: {result.output[:200]!r}"}
    return info


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "kernel": os.uname().release,
        "kernel_version": os.uname().version,
        "machine": os.uname().machine,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "memory_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for key, _, value in (line.partition(":") for line in f):
            if key.strip() == "model name":
                return value.strip()
    return None


def environment_info(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape a training run, with credentials redacted."""
    selected = {
        name: value
        for name, value in environ.items()
        if name in ENVIRONMENT_NAMES or name.startswith(ENVIRONMENT_PREFIXES)
    }
    return dict(sorted(redact_env(selected).items()))
