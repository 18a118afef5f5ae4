"""The job queue in one SQLite file (WAL, so on a local filesystem), shared by one host's
workers and command line; every write is one ``BEGIN IMMEDIATE`` transaction, and a submit
touches ``queue.db-wake``, which idle workers watch (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._contract import BlockingCallTimeout, run_blocking
from ._models import (
    BUSY_TIMEOUT_SECONDS,
    SCHEMA_VERSION,
    QueueDatabaseError,
    QueueMissingError,
    QueueUnavailableError,
    Sql,
    known_version,
    schema_statements,
)
from ._store import JobStore
from ._sweeps import EXTENSION_DDL, LAST_TABLE

if TYPE_CHECKING:
    from .._sampling import Inotify

_log = logging.getLogger("asyncsoak.queue")

#: ``PRAGMA application_id`` of a queue database ("asok").
APPLICATION_ID = 0x61736F6B
#: How long touching and watching the wake-up file may take before the worker polls instead.
WATCH_SETUP_TIMEOUT_SECONDS = 5.0
#: Beside ``queue.db``, the file whose touch wakes its idle workers: ``queue.db-wake``.
WAKE_SUFFIX = "-wake"
MOUNTINFO = Path("/proc/self/mountinfo")
#: Filesystems on which SQLite's WAL (shared memory, POSIX locks) is unsafe.
NETWORK_FILESYSTEMS = frozenset(
    {
        "9p",
        "afs",
        "beegfs",
        "ceph",
        "cifs",
        "davfs",
        "fuse.cephfs",
        "fuse.gcsfuse",
        "fuse.glusterfs",
        "fuse.juicefs",
        "fuse.rclone",
        "fuse.s3fs",
        "fuse.sshfs",
        "glusterfs",
        "gpfs",
        "lustre",
        "ncpfs",
        "nfs",
        "nfs4",
        "smb3",
        "smbfs",
    }
)
#: mountinfo writes space, tab, newline and backslash as octal escapes (``\040``...).
_OCTAL = re.compile(r"\\([0-7]{3})")


def filesystem_type(path: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """The type of the filesystem holding ``path`` (an existing directory), from mountinfo."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best: tuple[int, str] | None = None
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount = _OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[4])
        inside = mount == "/" or target == mount or target.startswith(mount.rstrip("/") + "/")
        # Among mounts on the same point, the last one listed is on top.
        if inside and (best is None or len(mount) >= best[0]):
            best = (len(mount), tail.split()[0])
    return best[1] if best else None


class SqliteStore(JobStore):
    """The queue in an SQLite file; ``create=False`` refuses a missing one.  ``clock``: wall-clock
    seconds (heartbeats are compared across this host's processes), injectable for tests."""

    _soak_max_duration = "json_extract(soak, '$.max_duration_seconds')"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.time,
        mountinfo: Path = MOUNTINFO,
    ) -> None:
        self.path = Path(path).expanduser().resolve()
        self.location = str(self.path)
        self.clock = clock
        self.busy_timeout = busy_timeout
        self._lock = threading.RLock()
        if self._check_location(create, mountinfo):
            self._create()
        self._conn = self._connect(self.path)
        stat = os.stat(self.path)
        self._identity = (stat.st_dev, stat.st_ino)

    def _refuse(self, problem: str) -> QueueDatabaseError:
        return QueueDatabaseError(self.path, problem)

    def _connect(self, path: Path) -> sqlite3.Connection:
        """Open ``path``, refuse it unless it is a sound queue database, bring its schema up."""
        try:
            conn = sqlite3.connect(
                path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise self._refuse(f"cannot open: {exc}") from exc
        self._conn = conn
        try:
            # Before anything writes (the WAL switch, a migration, a worker's registration):
            # a damaged file is refused as it is, never written to.
            problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
            if problems != ["ok"]:
                # SQLite's findings span lines: one line of them, the first few.
                found = "; ".join(" ".join(str(p).split()) for p in problems)
                raise self._refuse(
                    f"is corrupt ({found}); restore it from a backup, "
                    "or recover what it holds with: sqlite3 FILE .recover"
                )
            conn.execute("PRAGMA foreign_keys = ON")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise self._refuse(f"cannot use WAL journaling (got {mode})")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._refuse(f"cannot be used as a queue database ({exc})") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _create(self) -> None:
        """Build the schema in a temporary file, then link it into place: the database never
        exists half-made, and of two processes creating it at once the first link wins."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".new", dir=self.path.parent
            )
            os.close(fd)
            try:
                self._connect(Path(name)).close()
                with contextlib.suppress(FileExistsError):
                    os.link(name, self.path)
            finally:
                for leftover in (name, f"{name}-wal", f"{name}-shm"):
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
        except OSError as exc:
            raise self._refuse(f"cannot create: {exc.strerror}") from exc

    def _check_location(self, create: bool, mountinfo: Path) -> bool:
        """Refuse an unusable path; True when the database must be created."""
        exists = self.path.exists()
        if exists and not self.path.is_file():
            raise self._refuse("is not a file")
        if exists and self.path.stat().st_size == 0:
            raise self._refuse(
                "is an empty file, not a queue database (asyncsoak never leaves one "
                "empty); check --db, or remove the file to start a new queue"
            )
        if not exists and not create:
            raise QueueMissingError(self.path, "does not exist (submit a job first, or check --db)")
        directory = self.path.parent
        fstype = filesystem_type(directory, mountinfo) if directory.is_dir() else None
        if fstype in NETWORK_FILESYSTEMS:
            raise self._refuse(
                f"is on a network filesystem ({fstype}); SQLite's WAL needs a local "
                "filesystem: put the database on a local disk (--db or ASYNCSOAK_DB)"
            )
        return not exists

    def _migrate(self) -> None:
        """Bring the schema and the sweeps' tables up to date (no lock when they are)."""
        query = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
        current = self._schema_state(self._conn) == SCHEMA_VERSION
        if current and self._conn.execute(query, (LAST_TABLE,)).fetchone()[0]:
            return
        with self._write() as conn:
            version = self._schema_state(conn)
            if version == 0:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            for statement in (*schema_statements("sqlite", version), *EXTENSION_DDL):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _schema_state(self, conn: sqlite3.Connection) -> int:
        version = known_version(conn.execute("PRAGMA user_version").fetchone()[0], self.path)
        if version == 0:
            foreign = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        else:
            foreign = conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID
        if foreign:
            raise self._refuse("is an SQLite database, not a job queue")
        return version

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def now(self) -> float:
        return self.clock()

    def file_lost(self) -> str | None:
        # The open connection keeps a deleted file alive: a new submit makes a new file at
        # the path, which this connection never sees.
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return "was deleted"
        except OSError:
            return None  # unreadable for now: the store's calls say so
        if (stat.st_dev, stat.st_ino) != self._identity:
            return "was replaced by another file"
        return None

    def default_runs_dir(self) -> Path:
        """Runs live beside the database: ``queue.db`` keeps them in ``queue.runs/``."""
        return self.path.with_suffix(".runs")

    @contextmanager
    def _unavailable(self) -> Iterator[None]:
        """A lock held past ``busy_timeout`` (or a failing disk) as QueueUnavailableError."""
        with self._lock:
            try:
                yield
            except sqlite3.OperationalError as exc:
                raise QueueUnavailableError(self.path, str(exc)) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._unavailable():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _transaction(self) -> Iterator[Sql]:
        with self._write() as conn:
            yield Sql(conn, "?", self.clock())

    @contextmanager
    def _reading(self) -> Iterator[Sql]:
        with self._unavailable():
            yield Sql(self._conn, "?", self.clock())

    def _json(self, value: Any) -> str:
        return json.dumps(value)

    @property
    def wake_path(self) -> Path:
        return self.path.with_name(self.path.name + WAKE_SUFFIX)

    def _after_submit(self) -> None:
        """Touch the wake-up file (inotify's CLOSE_WRITE); failing costs only promptness."""
        with contextlib.suppress(OSError):
            os.close(os.open(self.wake_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))

    def _watch(self, watcher: Inotify) -> bool:
        self._after_submit()
        return watcher.watch_file(self.wake_path)

    async def listen(
        self,
        wake: Callable[[str], None],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``wake("submit")`` whenever the wake-up file is touched, until cancelled;
        returns at once where it cannot be watched (the poll finds jobs)."""
        from .._sampling import Inotify

        try:
            watcher = Inotify()
        except OSError as exc:
            _log.info(
                "queue database %s: no inotify (%s); new jobs found by polling", self.location, exc
            )
            task_status.started()
            return
        try:
            # Under a deadline: a hung disk costs only promptness.
            try:
                watched = await run_blocking(
                    self._watch,
                    watcher,
                    timeout=WATCH_SETUP_TIMEOUT_SECONDS,
                    what="watch wake-up file",
                )
            except BlockingCallTimeout:
                watched = False
            task_status.started()
            if not watched:
                _log.info(
                    "queue database %s: cannot watch %s; new jobs found by polling",
                    self.location,
                    self.wake_path,
                )
                return
            while True:
                await anyio.wait_readable(watcher.fd)
                if watcher.read(self.wake_path):
                    wake("submit")
        finally:
            watcher.close()
