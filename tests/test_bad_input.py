"""Bad input: malformed config, a wrong password, missing privileges, hostile identifiers.

What ``tests/test_config.py``, ``tests/test_cli.py`` and ``tests/test_capture_provision.py``
already cover (the config parser's messages, doctor's checks and remediation SQL) is not
repeated; these go through the pipeline itself (``run_stages``, ``pgmedallion run``) and,
for hostile names, all the way to gold and verify.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgmedallion.capture.errors import PipelineError
from pgmedallion.capture.run import RetryPolicy
from pgmedallion.core.config import ConfigError, load_config
from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

REPO = Path(__file__).resolve().parent.parent
QUICK = RetryPolicy(attempts=2, initial_delay_s=0.1)
SECRET = "h6-Wr0ng-pa55word-do-not-print"


def execute(conninfo: dict, *statements):
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


@pytest.mark.parametrize(
    "text, env, message",
    [
        ("[tables.'public.t']\ntruncate = 'drop'", {}, "truncate must be one of"),
        ("[lakehouse]\nwarehouse = 'x'", {}, "unknown key(s) in [lakehouse]: warehouse"),
        ("[source]\ntables = [1, 2]", {}, "[source] tables must be a list of strings"),
        ("[source]\nname = 'my-source'", {}, "[source] name must be a plain identifier"),
        ("[source]\npublication = 'p\"; DROP'", {}, "[source] publication must be a plain"),
        ("[tables]\n'public.t' = 1", {}, "must be a table of settings"),
        ("[source]\nname = 'ok'", {"PGMEDALLION_SOURCE_PORT": "54x"}, "[source] port must be"),
        ("[source]\nname = 'ok'", {"PGMEDALLION_LAKEHOUSE_NOPE": "1"}, None),
    ],
)
def test_malformed_config_is_refused_naming_the_key(tmp_path, text, env, message):
    path = tmp_path / "pgmedallion.toml"
    path.write_text(text)
    if message is None:  # unknown variables are not keys: ignored, not an error
        assert load_config(path, env=env).source.name == "ok"
        return
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env)
    assert message in str(info.value)


def test_the_password_never_shows_in_config_repr_or_errors(tmp_path):
    path = tmp_path / "pgmedallion.toml"
    path.write_text("[source]\nname = 'ok'\npassword_env = 'H6_PW'\nport = 'x'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={"H6_PW": SECRET})
    assert SECRET not in str(info.value)
    path.write_text("[source]\nname = 'ok'\npassword_env = 'H6_PW'\n")
    config = load_config(path, env={"H6_PW": SECRET})
    assert SECRET not in repr(config) and SECRET not in str(config)
    path.write_text(f"[source]\npassword = '{SECRET}'\n")  # never read from the file
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert "password" in str(info.value) and SECRET not in str(info.value)


def test_wrong_password_through_the_pipeline_names_it_and_never_shows_it(spark, db, caplog):
    caplog.set_level(logging.DEBUG)
    execute(db, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE t")
    cfg = make_config(dict(db, password=SECRET), "badpw")
    with pytest.raises(PipelineError) as info:
        run_stages(spark, cfg, retry=QUICK)
    message = str(info.value)
    assert "password authentication failed" in message
    assert SECRET not in message and db["password"] not in message
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "password authentication failed" in logged  # the retry said why
    assert SECRET not in logged and db["password"] not in logged


def test_wrong_password_on_the_command_line_exits_1_without_it(db, tmp_path):
    execute(db, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE t")
    config = tmp_path / "pgmedallion.toml"
    config.write_text(
        "[source]\n"
        f"host = '{db['host']}'\nport = {db['port']}\ndbname = '{db['dbname']}'\n"
        f"user = '{db['user']}'\npassword_env = 'H6_PW'\npublication = 'pub'\n"
        f"[lakehouse]\nstate_dir = '{tmp_path / 'state'}'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = subprocess.run(
        [sys.executable, "-c", "from pgmedallion.cli import entry; entry()", "-c", str(config)]
        + ["run"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(env, H6_PW=SECRET, PYTHONPATH=str(REPO)),
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "password authentication failed" in out
    assert "nothing was captured" in out
    assert SECRET not in out and db["password"] not in out


@pytest.fixture
def weak_role(pg, db, request):
    """A login role without REPLICATION or SELECT; dropped afterwards."""
    name = "h6_weak_" + request.node.name[-12:].lower().replace("[", "_").replace("]", "")
    admin = pg.conninfo()
    role = sql.Identifier(name)
    execute(admin, sql.SQL("DROP ROLE IF EXISTS {}").format(role))
    execute(admin, sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(role, sql.Literal(SECRET)))
    yield name
    execute(db, sql.SQL("DROP OWNED BY {}").format(role))
    execute(admin, sql.SQL("DROP ROLE IF EXISTS {}").format(role))


@pytest.mark.slow
def test_missing_privileges_fail_the_run_naming_what_is_missing(spark, pg, db, weak_role, caplog):
    caplog.set_level(logging.DEBUG)
    execute(
        db,
        "CREATE TABLE ledger (id int PRIMARY KEY, v text)",
        "ALTER TABLE ledger REPLICA IDENTITY FULL",
        "INSERT INTO ledger SELECT g, 'v' FROM generate_series(1, 10) g",
        "CREATE PUBLICATION pub FOR TABLE ledger",
    )
    role_db = dict(db, user=weak_role, password=SECRET)
    cfg = make_config(role_db, "badpriv")
    drop_schemas(spark, cfg)
    # No REPLICATION: the replication connection is refused.
    with pytest.raises(PipelineError) as info:
        run_stages(spark, cfg, retry=QUICK)
    refused = str(info.value).lower()
    assert "permission denied" in refused, refused
    assert "wal sender" in refused or "replication" in refused, refused
    # REPLICATION but no SELECT on the table: the snapshot names the table.
    execute(pg.conninfo(), sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(weak_role)))
    with pytest.raises(Exception) as info:
        run_stages(spark, cfg, retry=QUICK)
    assert "permission denied for table ledger" in str(info.value)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for text in (str(info.value), logged):
        assert SECRET not in text and db["password"] not in text
    # Granted: the same pipeline goes on and is exact.
    execute(db, sql.SQL("GRANT SELECT ON ledger TO {}").format(sql.Identifier(weak_role)))
    run_stages(spark, cfg, retry=QUICK)
    assert_exact(verify(spark, cfg), {"public.ledger": 10})


HOSTILE_SCHEMA = 'sch"ema ; DROP TABLE x; --'
SQL_TABLE = '"; DROP TABLE x; --'
HOSTILE_TABLES = {
    # table name -> its columns (name, type); the first column is the key where there is one
    '"; DROP TABLE x; --': [
        ("id", "int PRIMARY KEY"),
        ('"; DROP TABLE x; --', "text"),
        ("a b", "int"),
        ("Ünï cødé", "text"),
        ("back`tick", "text"),
        ("dot.ted", "numeric(8,2)"),
        ("MiXeD", "text[]"),
    ],
    "Tåble Ünïcode": [("Kéy", "text PRIMARY KEY"), ("x'y", "jsonb"), ("%s", "text")],
    "we.ird": [("v", "text"), ("n", "int")],  # no key: duplicates allowed
}


@pytest.mark.slow
def test_hostile_identifiers_are_captured_end_to_end(spark, db):
    def ident(*parts: str) -> str:
        return sql.Identifier(*parts).as_string()

    statements = [f"CREATE SCHEMA {ident(HOSTILE_SCHEMA)}"]
    for table, columns in HOSTILE_TABLES.items():
        name = ident(HOSTILE_SCHEMA, table)
        cols = ", ".join(f"{ident(c)} {t}" for c, t in columns)
        statements.append(f"CREATE TABLE {name} ({cols})")
        if "PRIMARY KEY" not in columns[0][1]:  # keyed tables keep DEFAULT: old rows by key
            statements.append(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    first = ident(HOSTILE_SCHEMA, '"; DROP TABLE x; --')
    second = ident(HOSTILE_SCHEMA, "Tåble Ünïcode")
    third = ident(HOSTILE_SCHEMA, "we.ird")
    statements += [
        f"INSERT INTO {first} SELECT g, 'v' || g, g, E'ü\\t' || g, '`' || g, g / 3.0,"
        " ARRAY['a', NULL, '\"q\"'] FROM generate_series(1, 50) g",
        f"INSERT INTO {second} VALUES ('k1', '{{\"a\": 1}}', '%s'), ('k 2', NULL, 'x')",
        f"INSERT INTO {third} VALUES ('dup', 1), ('dup', 1), ('x', NULL)",
        "CREATE PUBLICATION pub FOR ALL TABLES",
    ]
    execute(db, *statements)
    cfg = make_config(db, "hostile")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    execute(
        db,
        f"UPDATE {first} SET {ident('a b')} = -1, {ident('Ünï cødé')} = NULL WHERE id <= 10",
        f"UPDATE {first} SET id = id + 1000 WHERE id BETWEEN 11 AND 15",  # key change
        f"DELETE FROM {first} WHERE id BETWEEN 46 AND 50",
        f"UPDATE {second} SET {ident('Kéy')} = 'k3', {ident('%s')} = 'moved' WHERE "
        f"{ident('Kéy')} = 'k1'",
        f"DELETE FROM {third} WHERE ctid = (SELECT ctid FROM {third} WHERE v = 'dup' LIMIT 1)",
        f"INSERT INTO {third} VALUES ('x', NULL)",
    )
    result = verify(spark, cfg)
    assert_exact(
        result,
        {
            f"{HOSTILE_SCHEMA}.{SQL_TABLE}": 45,
            f"{HOSTILE_SCHEMA}.Tåble Ünïcode": 2,
            f"{HOSTILE_SCHEMA}.we.ird": 3,
        },
    )
    # Column names survive as they are, in silver and gold.
    tables = {t.table: t for t in result.tables}
    assert len(tables) == 3
    gold_names = [
        r["silver_table"]
        for r in spark.table(cfg.qualified("silver", "_tables")).collect()
        if r["table_name"] == '"; DROP TABLE x; --'
    ]
    (gold_name,) = gold_names
    columns = spark.table(cfg.qualified("gold", gold_name)).columns
    assert [c for c, _ in HOSTILE_TABLES['"; DROP TABLE x; --']] == [
        c for c in columns if c != "_lsn"
    ]
