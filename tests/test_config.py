"""Configuration: TOML, environment overrides, clear errors, no password leaks."""

from __future__ import annotations

import pytest

from pgmedallion.config import ConfigError, TablePolicy, load_config


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
