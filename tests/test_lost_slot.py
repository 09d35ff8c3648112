"""A lost replication slot recovered in place: dropped, then invalidated by
``max_slot_wal_keep_size``, while rows were written. Each time the next run stops with a
definite error that names the way back, ``pgmedallion resync --all`` snapshots every table
again at a new slot under the same names, the gap is recorded (bronze, ``status``), and
``verify`` finds gold exact. PostgreSQL (a server of the test's own: the invalidation needs
server settings; 18 and 15) is the oracle; the runs are whole ``pgmedallion`` processes.
"""

from __future__ import annotations

import psycopg
import pytest

from pgmedallion.capture.slot import starts_afresh
from pgmedallion.localpg import LocalPostgres
from tests.conftest import PG15_BIN, SERVERS
from tests.test_failover import (
    DB,
    SCHEMA,
    _lakehouse,
    _ok,
    _point_at,
    _run,
    _scalar,
    _workload,
)

SLOT = "shop_slot"
BATCHES = "SELECT array_agg(DISTINCT id / 1000 ORDER BY id / 1000) FROM items WHERE id >= 1000"
"""Which workloads (ids from 1000, 2000, ...) the source holds."""


@pytest.fixture(params=SERVERS)
def server(request, tmp_path):
    """A server of the test's own, PostgreSQL 18 and (where Debian's is installed) 15."""
    bin_dir = PG15_BIN if request.param == "pg15" else None
    pg = LocalPostgres(tmp_path / "pg", bin_dir=bin_dir).start()
    try:
        with psycopg.connect(**pg.conninfo(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        with psycopg.connect(**pg.conninfo(dbname=DB), autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute("CREATE TABLE scratch (v text)")  # not published: only WAL
        yield pg
    finally:
        pg.stop("immediate")


def _failed(done) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def _invalidate_slot(server: LocalPostgres) -> None:
    """WAL past ``max_slot_wal_keep_size`` while the slot is idle, and checkpoints, until the
    server invalidates the slot."""
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
    with psycopg.connect(**server.conninfo(dbname=DB), autocommit=True) as conn:
        for _ in range(20):
            conn.execute("INSERT INTO scratch SELECT repeat('x', 1000) FROM generate_series(1, 99)")
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            lost = conn.execute(
                "SELECT wal_status = 'lost' FROM pg_replication_slots WHERE slot_name = %s",
                (SLOT,),
            ).fetchone()[0]
            if lost:
                break
        assert lost, "the slot was not invalidated"
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        conn.execute("SELECT pg_reload_conf()")


@pytest.mark.slow
def test_a_dropped_then_an_invalidated_slot_are_recovered_in_place(server, tmp_path):
    config, env = _lakehouse(tmp_path, server, "failover_slot = 'off'\n")
    first = _ok(_run(config, env, "run"))
    assert "gold: public.items: 300 rows" in first.stdout, first.stdout
    with psycopg.connect(**server.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 1000)
    _ok(_run(config, env, "run"))

    # 1. dropped between two runs, while rows were written
    with psycopg.connect(**server.conninfo(dbname=DB), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        _workload(conn, 2000)
    stderr = _failed(_run(config, env, "run"))
    assert "SlotMissing" in stderr, stderr
    assert "pgmedallion resync --all" in stderr, stderr
    # nothing of a second try without the command gets further
    _failed(_run(config, env, "run"))
    assert _scalar(server, "SELECT count(*) FROM pg_replication_slots") == 0

    recovered = _ok(_run(config, env, "resync", "--all"))
    assert "public.events, public.items will be snapshotted again" in recovered.stdout, (
        recovered.stdout
    )
    assert "a new slot shop_slot takes its place" in recovered.stderr, recovered.stderr
    assert _scalar(server, "SELECT count(*) FROM pg_replication_slots") == 1
    with psycopg.connect(**server.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 3000)
    _ok(_run(config, env, "run"))

    # 2. invalidated: its WAL removed past max_slot_wal_keep_size
    with psycopg.connect(**server.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 4000)
    _invalidate_slot(server)
    stderr = _failed(_run(config, env, "run"))
    assert "SlotInvalidated" in stderr, stderr
    assert "pgmedallion resync --all" in stderr, stderr
    _ok(_run(config, env, "resync", "--all"))
    assert _scalar(
        server, "SELECT wal_status <> 'lost' FROM pg_replication_slots WHERE slot_name = %s", SLOT
    )
    with psycopg.connect(**server.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 5000)
    _ok(_run(config, env, "run"))

    status = _ok(_run(config, env, "status")).stdout
    gaps = [line for line in status.splitlines() if line.startswith("bronze gap:")]
    assert len(gaps) == 2, status
    assert "SlotMissing" in gaps[0] and "SlotInvalidated" in gaps[1], gaps

    verify = _ok(_run(config, env, "verify"))
    assert "verify: OK" in verify.stdout, verify.stdout
    # every workload is in gold: before the drop, in the gap, and after each recovery
    assert _scalar(server, BATCHES) == [1, 2, 3, 4, 5, 100]


def test_starts_afresh_only_when_no_table_needs_what_the_slot_held():
    snapshots = {1: 100, 2: 100, 3: 50}
    assert not starts_afresh(snapshots, set(), set(), 200)
    assert not starts_afresh(snapshots, {1, 2}, set(), 200)
    assert starts_afresh(snapshots, {1, 2}, {3}, 200)  # 3 was dropped at the source
    assert starts_afresh(snapshots, {1, 2, 3}, set(), 200)
    # snapshotted again at or after the point (a run that stopped after the new snapshots)
    assert starts_afresh({1: 200, 2: 250, 3: 50}, {3}, set(), 200)
    assert starts_afresh({1: 199, 2: 250}, set(), set(), 200)  # 199 holds commits below 200
    assert not starts_afresh({1: 198, 2: 250}, set(), set(), 200)
    assert not starts_afresh({}, set(), set(), 200)  # nothing captured: nothing to recover
    # no point yet (a slot still to be made): only tables waiting for a snapshot count
    assert not starts_afresh({1: 10**9}, set(), set())
    assert starts_afresh({1: 100, 2: 100}, {1}, {2})


@pytest.mark.slow
def test_another_server_is_taken_as_the_source_by_resync_all(tmp_path):
    """The source's database moved to another server (a restore, an upgrade: another system
    identifier, without our slot): the next run refuses it, and ``resync --all`` takes it as
    the source (its identity recorded: ``TimelineChanged`` no more) once its WAL is past
    bronze's frontier, under the same names; gold is then exactly the new server's."""
    servers = [LocalPostgres(tmp_path / name).start() for name in ("old", "new")]
    old, new = servers
    try:
        for server in servers:
            with psycopg.connect(**server.conninfo(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {DB}")
            with psycopg.connect(**server.conninfo(dbname=DB), autocommit=True) as conn:
                conn.execute(SCHEMA)
                conn.execute("CREATE TABLE scratch (v text)")
        config, env = _lakehouse(tmp_path, old, "failover_slot = 'off'\n")
        _ok(_run(config, env, "run"))
        with psycopg.connect(**old.conninfo(dbname=DB), autocommit=True) as conn:
            _workload(conn, 1000)
        _ok(_run(config, env, "run"))
        frontier = _scalar(old, "SELECT pg_current_wal_lsn()::text")

        _point_at(config, tmp_path, new, "failover_slot = 'off'\n")
        env["SHOP_PW"] = new.password
        with psycopg.connect(**new.conninfo(dbname=DB), autocommit=True) as conn:
            _workload(conn, 7000)
        stderr = _failed(_run(config, env, "run"))  # it has no slot of ours
        assert "SlotMissing" in stderr and "pgmedallion resync --all" in stderr, stderr
        with psycopg.connect(**new.conninfo(dbname=DB), autocommit=True) as conn:
            while conn.execute("SELECT pg_current_wal_lsn() <= %s::pg_lsn", (frontier,)).fetchone()[
                0
            ]:  # its WAL past bronze's frontier (else SourceBehind)
                conn.execute("INSERT INTO scratch VALUES ('x')")
                conn.execute("SELECT pg_switch_wal()")
        _ok(_run(config, env, "resync", "--all"))
        with psycopg.connect(**new.conninfo(dbname=DB), autocommit=True) as conn:
            _workload(conn, 8000)
        again = _ok(_run(config, env, "run"))
        assert "TimelineChanged" not in again.stderr, again.stderr
        status = _ok(_run(config, env, "status")).stdout
        assert "bronze gap:" in status, status
        verify = _ok(_run(config, env, "verify"))
        assert "verify: OK" in verify.stdout, verify.stdout
        # gold holds the new server's rows only: its workloads, none of the old server's
        assert _scalar(new, BATCHES) == [7, 8, 100]
    finally:
        for server in servers:
            server.stop("immediate")
