"""Capture across a failover, with real servers: a primary, a streaming standby made with
``pg_basebackup`` that keeps a copy of the failover slot (``sync_replication_slots``), the
standby promoted after the primary is gone, and the pipeline pointed at it.

PostgreSQL is the oracle: ``pgmedallion verify`` compares gold with the new primary. The runs
are whole ``pgmedallion`` processes, as a scheduled job starts them.
"""

from __future__ import annotations

import os
import pwd
import random
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable

from pgmedallion.capture.errors import (
    FailoverUnsupported,
    SlotMissing,
    SlotNotSynchronized,
    TimelineChanged,
)
from pgmedallion.capture.provision import failover_result
from pgmedallion.capture.slot import (
    SystemIdentity,
    TimelineSwitch,
    check_system,
    missing_slot,
    parse_timeline_history,
    wants_failover,
)
from pgmedallion.core.config import ConfigError, load_config
from pgmedallion.localpg import SERVER_USER, LocalPostgres, _free_port
from tests.test_cli import source_config

REPO = Path(__file__).resolve().parent.parent
DB = "shop"
STANDBY_SLOT = "standby1"

SCHEMA = """
CREATE TABLE items (id bigint PRIMARY KEY, name text, price numeric(10,2));
CREATE TABLE events (kind text, n int);
ALTER TABLE events REPLICA IDENTITY FULL;
INSERT INTO items SELECT g, 'item ' || g, g * 0.5 FROM generate_series(1, 300) g;
INSERT INTO events SELECT 'k' || (g % 5), g % 3 FROM generate_series(1, 60) g;
CREATE PUBLICATION shop_pub FOR TABLE items, events;
"""


def _workload(conn: psycopg.Connection, start: int) -> None:
    """Inserts, updates (a key too), deletes and a duplicate row, ids from ``start``."""
    conn.execute(
        "INSERT INTO items SELECT g, 'new ' || g, g FROM generate_series(%s::int, %s::int) g",
        (start, start + 49),
    )
    conn.execute("UPDATE items SET price = price + 1, name = name || '!' WHERE id % 7 = 0")
    conn.execute("DELETE FROM items WHERE id % 11 = 0")
    conn.execute("UPDATE items SET id = id + 100000 WHERE id = (SELECT min(id) FROM items)")
    conn.execute("UPDATE events SET n = n + 1 WHERE kind = 'k1'")
    conn.execute("INSERT INTO events SELECT kind, n FROM events WHERE kind = 'k3' LIMIT 2")


def _make_standby(primary: LocalPostgres, root: Path) -> LocalPostgres:
    """A streaming standby of ``primary`` through physical slot ``standby1``, keeping copies of
    failover slots: ``sync_replication_slots``, ``hot_standby_feedback``, a ``primary_conninfo``
    that names the database."""
    standby = LocalPostgres(root)
    standby.root.mkdir(parents=True)
    (standby.root / "password").write_text(primary.password + "\n")
    (standby.root / "port").write_text(str(_free_port()))
    if standby.as_root:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(standby.root, user.pw_uid, user.pw_gid)
    env = dict(os.environ, **primary.env())
    backup = [
        str(standby.bin_dir / "pg_basebackup"),
        "-D",
        str(standby.data),
        "-X",
        "stream",
        "-c",
        "fast",
    ]
    standby._run([*backup, "-S", STANDBY_SLOT, "--write-recovery-conf"], env=env)
    conninfo = psycopg.conninfo.make_conninfo(**primary.conninfo(dbname=DB))
    with open(standby.data / "postgresql.auto.conf", "a") as f:
        f.write(
            f"port = {standby.port}\n"
            f"primary_conninfo = '{conninfo}'\n"
            f"primary_slot_name = '{STANDBY_SLOT}'\n"
            "sync_replication_slots = on\n"
            "hot_standby_feedback = on\n"
        )
    return standby.start()


@pytest.fixture
def pair(tmp_path):
    """A primary with database ``shop`` (the schema above), a physical slot for the standby
    named in ``synchronized_standby_slots``, and the standby streaming from it."""
    primary = LocalPostgres(tmp_path / "primary").start()
    standby = None
    try:
        with psycopg.connect(**primary.conninfo(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (STANDBY_SLOT,))
            conn.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'")
            conn.execute("SELECT pg_reload_conf()")
        with psycopg.connect(**primary.conninfo(dbname=DB), autocommit=True) as conn:
            conn.execute(SCHEMA)
        standby = _make_standby(primary, tmp_path / "standby")
        yield primary, standby
    finally:
        for server in (standby, primary):
            if server is not None:
                server.stop("immediate")


def _lakehouse(tmp_path: Path, server: LocalPostgres, extra: str = "") -> tuple[Path, dict]:
    config = tmp_path / "pgmedallion.toml"
    _point_at(config, tmp_path, server, extra)
    env = dict(os.environ, SHOP_PW=server.password, PYTHONPATH=str(REPO))
    return config, env


def _point_at(config: Path, tmp_path: Path, server: LocalPostgres, extra: str = "") -> None:
    text = source_config(server.conninfo(dbname=DB), "shop", tmp_path / "state")
    config.write_text(text.replace("[lakehouse]", extra + "[lakehouse]"))


def _run(config: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pgmedallion.cli", "-c", str(config), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )


def _ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _scalar(server: LocalPostgres, query: str, *params):
    with psycopg.connect(**server.conninfo(dbname=DB), autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def _wait_for(what: str, check, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.5)


def _wait_replayed(primary: LocalPostgres, standby: LocalPostgres) -> None:
    """Until the standby has replayed everything the primary wrote so far."""
    target = _scalar(primary, "SELECT pg_current_wal_lsn()::text")
    _wait_for(
        "standby replay",
        lambda: _scalar(standby, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", target),
    )


def _fail_over(primary: LocalPostgres, standby: LocalPostgres) -> None:
    """The primary is lost (stopped at once), the standby promoted."""
    primary.stop("immediate")
    standby._run([str(standby.bin_dir / "pg_ctl"), "-D", str(standby.data), "-w", "promote"])
    _wait_for("promotion", lambda: not _scalar(standby, "SELECT pg_is_in_recovery()"))


def _reset_standby_slots(server: LocalPostgres) -> None:
    """What the new primary's operator does: it has no standby (yet) to wait for."""
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM RESET synchronized_standby_slots")
        conn.execute("SELECT pg_reload_conf()")


def _bronze_version(tmp_path: Path) -> int:
    return DeltaTable(str(tmp_path / "state" / "warehouse" / "pgm_bronze.db" / "bronze")).version()


@pytest.mark.slow
def test_capture_goes_on_on_a_promoted_standby_and_gold_stays_exact(pair, tmp_path):
    primary, standby = pair
    config, env = _lakehouse(tmp_path, primary)

    doctor = _ok(_run(config, env, "doctor"))
    assert f"synchronized_standby_slots = {STANDBY_SLOT}" in doctor.stdout, doctor.stdout
    assert "sync_replication_slots = on" in doctor.stdout
    # the standby-side advice is executable there as printed (ALTER SYSTEM works on a standby)
    advice = [line.strip() for line in doctor.stdout.splitlines()]
    with psycopg.connect(**standby.conninfo(), autocommit=True) as conn:
        for statement in (
            "ALTER SYSTEM SET sync_replication_slots = on;",
            "SELECT pg_reload_conf();",
        ):
            assert statement in advice, doctor.stdout
            conn.execute(statement)

    first = _ok(_run(config, env, "run"))
    assert "gold: public.items: 300 rows" in first.stdout, first.stdout
    failover = "SELECT failover FROM pg_replication_slots WHERE slot_name = 'shop_slot'"
    assert _scalar(primary, failover) is True

    with psycopg.connect(**primary.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 1000)
    _ok(_run(config, env, "run"))
    # changes bronze has not read when the primary is lost: the standby's copy of the slot
    # must still hold them
    with psycopg.connect(**primary.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 2000)
    _wait_replayed(primary, standby)
    confirmed = _scalar(
        primary,
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'shop_slot'",
    )
    _wait_for(
        "the standby's copy of the slot",
        lambda: _scalar(
            standby,
            "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots"
            " WHERE slot_name = 'shop_slot' AND synced AND failover",
            confirmed,
        ),
    )

    _fail_over(primary, standby)
    with psycopg.connect(**standby.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 3000)
    _point_at(config, tmp_path, standby)
    # the standby was copied with the primary's synchronized_standby_slots, which names a
    # slot it does not have: doctor says so (the run's preflight too), and how to fix it
    doctor = _run(config, env, "doctor")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert f"synchronized_standby_slots names {STANDBY_SLOT}, not a physical slot" in (
        doctor.stdout
    )
    assert "ALTER SYSTEM RESET synchronized_standby_slots;" in doctor.stdout
    _reset_standby_slots(standby)

    after = _ok(_run(config, env, "run"))
    assert "a promoted standby; capture continues there" in after.stderr, after.stderr
    # the new timeline was recorded: the next run compares with it, and has nothing to say
    with psycopg.connect(**standby.conninfo(dbname=DB), autocommit=True) as conn:
        conn.execute("UPDATE items SET price = price * 2 WHERE id % 5 = 0")
    again = _ok(_run(config, env, "run"))
    assert "promoted standby" not in again.stderr, again.stderr

    verify = _ok(_run(config, env, "verify"))
    assert "verify: OK" in verify.stdout, verify.stdout
    for table in ("public.items", "public.events"):
        assert table in verify.stdout, verify.stdout
    # the oracle holds rows of the workload read before the failover, of the one the old
    # primary had when it was lost (read through the standby's copy of the slot), and of the
    # one written on the new primary
    batches = "SELECT array_agg(DISTINCT id / 1000 ORDER BY id / 1000) FROM items WHERE id >= 1000"
    assert _scalar(standby, batches) == [1, 2, 3, 100]


def test_a_slot_the_standby_never_had_stops_capture_and_names_the_way_back(pair, tmp_path):
    primary, standby = pair
    # not a failover slot: the standby keeps no copy of it
    config, env = _lakehouse(tmp_path, primary, "failover_slot = 'off'\n")
    first = _ok(_run(config, env, "run", "--stage", "capture"))
    assert "messages, frontier" in first.stdout, first.stdout
    assert _scalar(
        primary, "SELECT NOT failover FROM pg_replication_slots WHERE slot_name = 'shop_slot'"
    )
    with psycopg.connect(**primary.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 1000)
    _wait_replayed(primary, standby)
    _fail_over(primary, standby)
    _reset_standby_slots(standby)
    assert _scalar(standby, "SELECT count(*) FROM pg_replication_slots") == 0
    before = _bronze_version(tmp_path)

    _point_at(config, tmp_path, standby, "failover_slot = 'off'\n")
    failed = _run(config, env, "run", "--stage", "capture")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "Traceback" not in failed.stderr, failed.stderr
    assert "SlotNotSynchronized" in failed.stderr, failed.stderr
    assert "had no copy of the slot" in failed.stderr
    assert "point [source] back at it" in failed.stderr
    assert "pgmedallion resync --all" in failed.stderr
    # nothing was written: bronze is as it was, without an error record
    assert _bronze_version(tmp_path) == before

    # the way back: the old primary, still whole, with its slot
    primary.start()
    _point_at(config, tmp_path, primary, "failover_slot = 'off'\n")
    back = _ok(_run(config, env, "run", "--stage", "capture"))
    assert "messages, frontier" in back.stdout
    assert _bronze_version(tmp_path) > before


@pytest.mark.slow
def test_a_slot_the_standby_never_had_is_recovered_in_place_on_it(pair, tmp_path):
    """No old primary to go back to: ``resync --all`` on the promoted standby makes a new slot
    there, snapshots every table at it, records the gap, and gold is exact."""
    primary, standby = pair
    config, env = _lakehouse(tmp_path, primary, "failover_slot = 'off'\n")
    _ok(_run(config, env, "run"))
    with psycopg.connect(**primary.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 1000)
    _wait_replayed(primary, standby)
    _fail_over(primary, standby)
    _reset_standby_slots(standby)
    with psycopg.connect(**standby.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 2000)
    _point_at(config, tmp_path, standby, "failover_slot = 'off'\n")
    failed = _run(config, env, "run")
    assert failed.returncode == 1 and "SlotNotSynchronized" in failed.stderr, failed.stderr

    _ok(_run(config, env, "resync", "--all"))
    with psycopg.connect(**standby.conninfo(dbname=DB), autocommit=True) as conn:
        _workload(conn, 3000)
    _ok(_run(config, env, "run"))
    status = _ok(_run(config, env, "status")).stdout
    assert "bronze gap: changes from" in status, status
    verify = _ok(_run(config, env, "verify"))
    assert "verify: OK" in verify.stdout, verify.stdout
    batches = "SELECT array_agg(DISTINCT id / 1000 ORDER BY id / 1000) FROM items WHERE id >= 1000"
    assert _scalar(standby, batches) == [1, 2, 3, 100]


TIMELINE = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
"""The server's timeline: the first eight hex digits of its current WAL file's name."""


def _pgbench(server: LocalPostgres, *args: str) -> subprocess.Popen:
    env = {**os.environ, **server.env(), "PGDATABASE": DB}
    return subprocess.Popen(
        [str(server.bin_dir / "pgbench"), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _standby_of(primary: LocalPostgres, root: Path) -> LocalPostgres:
    """What an operator does after a failover: a new standby of the new primary, through a
    physical slot of its own named in ``synchronized_standby_slots``."""
    with psycopg.connect(**primary.conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_create_physical_replication_slot(%s)", (STANDBY_SLOT,))
        conn.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'")
        conn.execute("SELECT pg_reload_conf()")
    return _make_standby(primary, root)


def _capture_until_synced(
    config: Path, env: dict, primary: LocalPostgres, standby: LocalPostgres
) -> None:
    """Capture runs until the standby's copy of the slot is at the primary's: a new standby
    keeps a copy only once the slot needs no WAL from before the standby's own (the server
    logs "could not synchronize replication slot" until then), so the slot must move on."""
    for _ in range(20):
        _ok(_run(config, env, "run", "--stage", "capture"))
        confirmed = _scalar(
            primary,
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
            " WHERE slot_name = 'shop_slot'",
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _scalar(
                standby,
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots"
                " WHERE slot_name = 'shop_slot' AND synced AND failover",
                confirmed,
            ):
                return
            time.sleep(0.5)
    raise AssertionError("the standby never kept a copy of the slot")


@pytest.mark.slow
def test_five_promotions_at_random_moments_under_pgbench_load(pair, tmp_path):
    """pgbench writes to the primary while runs capture; at a random moment the primary is
    lost and the standby promoted, five times (a new standby made of each new primary). Gold
    then equals the last primary: nothing lost, nothing twice (what PostgreSQL itself lost
    with an asynchronous standby was never captured: ``synchronized_standby_slots``)."""
    primary, standby = pair
    servers = [primary, standby]
    rng = random.Random(48)
    try:
        init = _pgbench(primary, "-i", "-q", "-s", "1")
        assert init.wait(timeout=300) == 0
        with psycopg.connect(**primary.conninfo(dbname=DB), autocommit=True) as conn:
            conn.execute(
                "ALTER PUBLICATION shop_pub ADD TABLE pgbench_accounts, pgbench_branches,"
                " pgbench_tellers, pgbench_history"
            )
            conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")  # doctor's advice
        config, env = _lakehouse(tmp_path, primary)
        _ok(_run(config, env, "run"))
        timelines = []
        for promotion in range(5):
            load = _pgbench(primary, "-n", "-c", "2", "-j", "1", "-R", "100", "-T", "600")
            try:
                time.sleep(rng.uniform(0.5, 3))
                _ok(_run(config, env, "run"))  # captures under load
                _capture_until_synced(config, env, primary, standby)
                time.sleep(rng.uniform(0, 3))  # more changes, not read: the standby's copy
                _fail_over(primary, standby)
            finally:
                load.kill()
                load.wait()
            _reset_standby_slots(standby)
            _point_at(config, tmp_path, standby)
            after = _ok(_run(config, env, "run"))
            assert "a promoted standby; capture continues there" in after.stderr, after.stderr
            timelines.append(_scalar(standby, TIMELINE))
            primary = standby
            if promotion < 4:
                # (it keeps a copy of the slot once runs move the slot: the next round)
                standby = _standby_of(primary, tmp_path / f"standby-{promotion + 2}")
                servers.append(standby)
        assert timelines == [2, 3, 4, 5, 6], timelines
        verify = _ok(_run(config, env, "verify"))
        assert "verify: OK" in verify.stdout, verify.stdout
        assert "public.pgbench_history" in verify.stdout, verify.stdout
        assert _scalar(primary, "SELECT count(*) FROM pgbench_history") > 0
    finally:
        for server in servers[2:]:
            server.stop("immediate")


# The rules on their own, without servers.

SYSTEM = "7713418456894041212"


def _identity(timeline: int, system: str = SYSTEM) -> SystemIdentity:
    return SystemIdentity(system, timeline, 0, DB)


def test_a_later_timeline_is_accepted_only_when_bronze_ends_at_or_before_its_switch_point():
    history = parse_timeline_history(
        "1\t0/40001A8\tno recovery target specified\n\n2\t0/5000000\tat failover\n"
    )
    assert history == [TimelineSwitch(1, 0x40001A8), TimelineSwitch(2, 0x5000000)]
    assert check_system(_identity(1), _identity(1), 0x9000000) is False
    assert check_system(_identity(2), _identity(1), 0x40001A8, history[:1]) is True
    assert check_system(_identity(3), _identity(1), 0x4000000, history) is True
    assert check_system(_identity(3), _identity(2), 0x5000000, history) is True
    with pytest.raises(TimelineChanged, match="branched off at 0/40001A8.*resync --all"):
        check_system(_identity(2), _identity(1), 0x40001A9, history[:1])
    with pytest.raises(TimelineChanged, match="does not descend"):
        check_system(_identity(1), _identity(2), 0)
    with pytest.raises(TimelineChanged, match="does not descend"):  # no history, no branch
        check_system(_identity(2), _identity(1), 0, [])
    with pytest.raises(TimelineChanged, match="another server"):
        check_system(_identity(1, "42"), _identity(1), 0)


def test_a_missing_slot_on_a_promoted_standby_is_told_apart_from_a_dropped_one():
    recorded = {"system_id": SYSTEM, "timeline": 1}
    gone = SlotMissing("replication slot 's' does not exist")
    error = missing_slot(gone, "changes up to 0/1", _identity(2), recorded)
    assert isinstance(error, SlotNotSynchronized)
    assert "point [source] back at it" in str(error)
    for found in (_identity(1), _identity(2, "42")):
        assert type(missing_slot(gone, "snapshots", found, recorded)) is SlotMissing
    assert type(missing_slot(gone, "snapshots", _identity(2), None)) is SlotMissing


def test_failover_slot_setting():
    assert wants_failover("auto", 170000) and wants_failover("on", 180001)
    assert not wants_failover("auto", 150004) and not wants_failover("off", 180000)
    with pytest.raises(FailoverUnsupported, match="PostgreSQL 15"):
        wants_failover("on", 150004)
    assert load_config(env={}).source.failover_slot == "auto"
    for given, read in ((False, "off"), (True, "on"), ("Auto", "auto"), ("no", "off")):
        assert _config_with(f"failover_slot = {given!r}".lower()).source.failover_slot == read
    with pytest.raises(ConfigError, match="failover_slot must be auto, on or off"):
        _config_with("failover_slot = 'sometimes'")


def _config_with(line: str):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(f"[source]\n{line}\n")
        f.flush()
        return load_config(f.name, env={})


def test_doctor_advice_for_the_standby_side():
    none = failover_result([], {}, DB)
    assert none.ok and not none.warning and "(information" in none.message
    assert "pg_create_physical_replication_slot('standby1')" in none.remediation_sql
    assert "ALTER SYSTEM SET sync_replication_slots = on;" in none.remediation_sql
    assert f"dbname={DB}" in none.remediation_sql
    unnamed = failover_result([], {"s1": True}, DB)
    assert unnamed.ok and unnamed.warning
    assert "ALTER SYSTEM SET synchronized_standby_slots = 's1';" in unnamed.remediation_sql
    assert "SELECT pg_reload_conf();" in unnamed.remediation_sql
    wrong = failover_result(["gone"], {"s1": True}, DB)
    assert not wrong.ok and "ALTER SYSTEM RESET" in wrong.remediation_sql
    idle = failover_result(["s1"], {"s1": False}, DB)
    assert idle.ok and idle.warning and "no standby streams from s1" in idle.message
    good = failover_result(["s1"], {"s1": True}, DB)
    assert good.ok and not good.warning
    assert "ALTER SYSTEM SET primary_slot_name = 's1';" in good.remediation_sql
    for result in (none, unnamed, wrong, idle, good):
        assert "DROP" not in (result.remediation_sql or "").upper()
        assert "drop_replication_slot" not in (result.remediation_sql or "")
