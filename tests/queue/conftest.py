"""Fixtures of the job queue's tests: a store on each backend.

``store`` and ``db`` are parametrised over SQLite (a file in the test's directory) and
PostgreSQL (a fresh database on a server the session starts: a throwaway cluster in a
temporary directory, see ``pg_cluster.py``), so the behavioural suite runs on both.  Without
PostgreSQL's binaries the PostgreSQL half skips, except in CI (``CI`` set), where it fails:
``.ci/run`` installs them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncsoak.queue import JobStore, SqliteStore, open_store

from .pg_cluster import PgCluster, find_bindir

#: The PostgreSQL half needs a server (started once a session, a database made per test): it
#: is left out of the fast lane (``-m "not slow"``), where the SQLite half runs.
BACKENDS = ("sqlite", pytest.param("postgres", marks=pytest.mark.slow))


@pytest.fixture(scope="session")
def pg_bindir() -> Path:
    bindir = find_bindir()
    if bindir is None:
        message = "PostgreSQL's initdb and pg_ctl are not installed (apt-get install postgresql)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return bindir


@pytest.fixture(scope="session")
def pg_cluster(pg_bindir: Path) -> Iterator[PgCluster]:
    """One server for the session; each test gets its own database on it."""
    cluster = PgCluster(pg_bindir)
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def _restartable_pg_cluster(pg_bindir: Path) -> Iterator[PgCluster]:
    cluster = PgCluster(pg_bindir)
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def own_pg_cluster(_restartable_pg_cluster: PgCluster) -> PgCluster:
    """A server apart from the one the other tests share, for tests that stop or restart
    it; running when the test starts (whatever the previous test left)."""
    if not _restartable_pg_cluster.running:
        _restartable_pg_cluster.start()
    return _restartable_pg_cluster


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty queue database: an SQLite path, or a PostgreSQL URL."""
    if request.param == "sqlite":
        return str(tmp_path / "queue.db")
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    return cluster.create_database()


@pytest.fixture
def store(db: str) -> Iterator[JobStore]:
    with open_store(db) as s:
        yield s


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqliteStore]:
    """A store for what only SQLite has (its file, its write lock)."""
    s = SqliteStore(tmp_path / "queue.db")
    try:
        yield s
    finally:
        s.close()
