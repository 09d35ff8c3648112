"""Configuration: TOML, environment overrides, clear errors, no password leaks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pgmedallion.config import ConfigError, SourceConfig, TablePolicy, load_config


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
    ],
)
def test_malformed_config_names_the_problem(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text), env={})
    assert message in str(info.value)


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
