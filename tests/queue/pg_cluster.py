"""A throwaway PostgreSQL server for the queue's tests: a cluster in a temporary directory.

``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user
(``runuser``); the data directory and the unix socket live in a directory that user owns,
under ``/tmp`` (pytest's own temporary directories are private to root).  ``fsync=off``:
the tests crash workers, not the server's machine.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: Longest wait for one of initdb, pg_ctl start, stop or restart.
PG_CTL_TIMEOUT_S = 60
_SERVER_OPTIONS = (
    "-c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
    "-c full_page_writes=off -c max_connections=200"
)


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: PATH first, then Debian's layout."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PgCluster:
    """One server: ``start``, ``stop`` (for a network cut), ``restart``, ``destroy``."""

    _databases = itertools.count(1)

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="asyncsoak-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._as_postgres = os.getuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.dir.chmod(0o755)
        self.running = False
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--no-locale", "--no-sync",
        )  # fmt: skip
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        argv: Sequence[str] = [str(self.bindir / tool), *args]
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=PG_CTL_TIMEOUT_S, cwd=self.dir
        )
        if result.returncode != 0:
            log = self.dir / "pg.log"
            detail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {result.stderr}\n{detail}")

    def _ctl(self, action: str) -> None:
        options = f"{_SERVER_OPTIONS} -p {self.port} -k {self.dir}"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.dir / "pg.log"), "-w",
            "-t", str(PG_CTL_TIMEOUT_S), "-m", "fast", "-o", options, action,
        )  # fmt: skip

    def start(self) -> None:
        self._ctl("start")
        self.running = True

    def stop(self) -> None:
        self._ctl("stop")
        self.running = False

    def restart(self) -> None:
        self._ctl("restart")
        self.running = True

    def url(self, database: str = "postgres") -> str:
        """A URL through the unix socket in the cluster's directory."""
        return f"postgresql://postgres@/{database}?host={self.dir}&port={self.port}"

    def create_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = f"queue_{os.getpid()}_{next(self._databases)}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        if self.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
