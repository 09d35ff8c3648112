"""Configuration: TOML, environment overrides, clear errors, no password leaks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pgmedallion.core.config import (
    ColumnPolicy,
    ConfigError,
    SourceConfig,
    TablePolicy,
    load_config,
)


def _write(tmp_path, text: str):
    path = tmp_path / "pgmedallion.toml"
    path.write_text(text)
    return path


def test_file_and_environment(tmp_path):
    path = _write(
        tmp_path,
        """
[source]
name = "shop"
host = "db.internal"
port = 6543
tables = ["public.orders"]
[lakehouse]
gold_schema = "gold"
[tables."public.orders"]
on_error = "quarantine"
""",
    )
    config = load_config(
        path,
        env={
            "PGMEDALLION_SOURCE_SLOT": "s2",
            "SECRET": "hunter2",
            "PGMEDALLION_SOURCE_PASSWORD_ENV": "SECRET",
        },
    )
    assert config.source.name == "shop" and config.source.slot == "s2"
    assert config.source.tables == ("public.orders",)
    assert config.policy("public.orders") == TablePolicy(on_error="quarantine")
    assert config.policy("public.other") == TablePolicy()
    assert config.qualified("gold", "orders") == "`gold`.`orders`"
    assert config.source.conninfo() == {"host": "db.internal", "port": "6543"}


def test_password_comes_from_its_variable_and_is_never_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "s3cr3t-value")
    config = load_config(_write(tmp_path, "[source]\nuser = 'capture'\n"), env={})
    assert config.source.conninfo()["password"] == "s3cr3t-value"
    assert "s3cr3t" not in repr(config)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[source\nname='x'", "not valid TOML"),
        ("[source]\nport = 'five'", "[source] port must be an integer"),
        ("[source]\nslot = 'a; DROP'", "[source] slot must be a plain identifier"),
        ("[source]\nbogus = 1", "unknown key(s) in [source]: bogus"),
        ("[sourc]\nname = 'x'", "unknown section(s): sourc"),
        ("[tables.'public.t']\non_error = 'ignore'", "on_error must be one of"),
        ("[source]\ntables = 'a,b'\ncreate_publication = 'maybe'", "must be true or false"),
        ("[source]\nsnapshot_wait_seconds = 'soon'", "snapshot_wait_seconds must be a number"),
        ("[source]\nsnapshot_wait_seconds = -1", "must be a number of 0 or more"),
    ],
)
def test_malformed_config_names_the_problem(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text), env={})
    assert message in str(info.value)


def test_numbers_from_file_and_environment(tmp_path):
    """A number of seconds may be written as an integer or a decimal, in the file or the
    environment."""
    for text, env, expected in (
        ("[source]\nsnapshot_wait_seconds = 0", {}, 0.0),
        ("[source]\nsnapshot_wait_seconds = 1.5", {}, 1.5),
        ("", {"PGMEDALLION_SOURCE_SNAPSHOT_WAIT_SECONDS": "10"}, 10.0),
    ):
        cfg = load_config(_write(tmp_path, text), env=env)
        assert cfg.source.snapshot_wait_seconds == expected


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})


def test_secret_scope_keys_come_from_file_and_environment(tmp_path):
    path = _write(tmp_path, "[source]\npassword_secret_scope = 'pg'\npassword_secret_key = 'k1'\n")
    config = load_config(path, env={"PGMEDALLION_SOURCE_PASSWORD_SECRET_KEY": "k2"})
    assert (config.source.password_secret_scope, config.source.password_secret_key) == (
        "pg",
        "k2",
    )


def test_secret_scope_off_databricks_is_a_clear_error_without_the_password(monkeypatch):
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    monkeypatch.setenv("PGPASSWORD", "env-s3cr3t")
    source = SourceConfig(password_secret_scope="pgm-scope", password_secret_key="pg-password")
    # The scope outranks password_env: it is consulted (and fails here) before PGPASSWORD.
    with pytest.raises(ConfigError) as info:
        source.conninfo()
    message = str(info.value)
    assert "only available on Databricks" in message
    assert "'pgm-scope'" in message and "'pg-password'" in message
    assert "env-s3cr3t" not in message


def test_password_precedence_field_then_secret_then_variable(monkeypatch):
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    monkeypatch.setenv("PGMEDALLION_TEST_PW", "from-env")
    scoped = SourceConfig(
        password_env="PGMEDALLION_TEST_PW",
        password_secret_scope="pgm-scope",
        password_secret_key="pg-password",
    )
    # An explicit password wins; the secret scope is then never read (no error off Databricks).
    explicit = replace(scoped, password="from-code")
    assert explicit.conninfo()["password"] == "from-code"
    assert "from-code" not in repr(explicit)
    # Scope and key are used only together: half a secret reference falls through to the variable.
    for half in (
        replace(scoped, password_secret_key=""),
        replace(scoped, password_secret_scope=""),
    ):
        assert half.conninfo()["password"] == "from-env"
    monkeypatch.delenv("PGMEDALLION_TEST_PW")
    assert "password" not in replace(scoped, password_secret_scope="").conninfo()


def test_column_policies(tmp_path):
    path = _write(
        tmp_path,
        """
[tables."public.ledger"]
infinity = "null"
[tables."public.ledger".columns]
ratio = "Decimal(38, 30)"
valid_to = { infinity = "error" }
amount = { type = "double" }
""",
    )
    policy = load_config(path, env={}).policy("public.ledger")
    assert policy.column("ratio") == ColumnPolicy("Decimal(38, 30)", "null")
    assert policy.column("valid_to") == ColumnPolicy("", "error")
    assert policy.column("amount") == ColumnPolicy("double", "null")
    assert policy.column("other") == ColumnPolicy("", "null")
    assert load_config(None, env={}).policy("public.x").column("y").infinity == "clamp"


@pytest.mark.parametrize(
    "columns, message",
    [
        ('ratio = "text"', "[tables.'public.t'.columns] ratio: unknown type 'text'"),
        ('ratio = "decimal(39,2)"', "ratio: unknown type 'decimal(39,2)'"),
        ('ratio = "decimal(5,6)"', "ratio: unknown type"),
        ('d = { infinity = "max" }', "d: infinity must be one of"),
        ('d = { kind = "x" }', "d: unknown key(s) kind"),
        ("d = 3", "d must be a type name"),
    ],
)
def test_malformed_column_policies_name_the_key(tmp_path, columns, message):
    path = _write(tmp_path, f'[tables."public.t".columns]\n{columns}\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert message in str(err.value)
