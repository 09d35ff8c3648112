"""Configuration: a TOML file, environment variables, and nothing else.

::

    # pgmedallion.toml
    [source]
    name = "shop"                  # names bronze rows and the pipeline; [A-Za-z0-9_]
    dsn = "host=db.example port=5432 dbname=shop user=capture"   # optional libpq string
    host = "127.0.0.1"             # or the separate keys; PG* variables fill the gaps
    port = 5432
    dbname = "shop"
    user = "capture"
    password_env = "PGPASSWORD"    # the variable that holds the password (never the file)
    password_secret_scope = ""     # Databricks: the secret scope holding the password...
    password_secret_key = ""       # ...and its key there (both set, or neither is used)
    publication = "pgmedallion"
    slot = "pgmedallion_shop"
    tables = ["public.customers", "public.orders"]   # empty: every table in the publication
    create_publication = true      # create/extend the publication when the role may
    failover_slot = "auto"         # auto | on | off: create the slot as a failover slot, which
                                   # a standby keeps a copy of (PostgreSQL 17+; auto: where the
                                   # server has them; on: a server before 17 is an error)
    snapshot_range_mb = 32         # a large table with an integer or uuid key is snapshotted
                                   # in key ranges of this size, so a stopped snapshot resumes
    snapshot_ranges_per_commit = 0 # ranges per bronze commit (0: one per worker locally, four
                                   # per worker through Spark); a stop redoes at most one commit

    [lakehouse]
    state_dir = ".pgmedallion"     # local runs: warehouse, metastore, checkpoints, PostgreSQL
    catalog = ""                   # Unity Catalog name on Databricks; empty locally
    bronze_schema = "pgm_bronze"
    silver_schema = "pgm_silver"
    gold_schema = "pgm_gold"
    marts = ""                     # a folder of declarative marts over gold (e.g. "marts/shop"),
                                   # relative to this file; empty: no marts (`run` skips them)
    marts_schema = "pgm_marts"     # where the marts and their `_quality` table are written

    [tables."public.orders"]
    on_error = "fail"              # fail | quarantine | warn  (gold's policy for definite errors)
    truncate = "error"             # error | delete  (TRUNCATE: an error, or delete every row)
    on_schema_change = "follow"    # follow | resync | error  (ALTER TABLE on the source: follow
                                   # what is exact as it is, snapshot the table again for the
                                   # rest; resync on every change; or stop at an error)
    infinity = "clamp"             # clamp | null | error  (±infinity dates and timestamps)

    [tables."public.orders".columns]
    ratio = "decimal(38,30)"       # a type override: string, double, float, bigint, int,
                                   # smallint or decimal(p,s)
    valid_to = { infinity = "null" }                   # a column's own infinity policy
    amount = { type = "double", infinity = "error" }   # (both keys are optional)

    [tables."public.customers".columns]
    ssn = { pii = "exclude" }      # never reaches bronze (snapshot and stream alike)
    email = { pii = "hash" }       # a keyed hash (HMAC-SHA256, hex text): joins work, values
                                   # cannot be read back; the key is a secret (below)

Precedence, lowest first: built-in defaults, the file, ``PGMEDALLION_*`` variables
(``PGMEDALLION_SOURCE_SLOT=...``, ``PGMEDALLION_LAKEHOUSE_GOLD_SCHEMA=...``). Connection keys left
unset are filled by libpq from ``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGDATABASE``, ``PGPASSWORD``...
A malformed file or value is a ``ConfigError`` that names the key; the password is never part of
any message or ``repr``. A column policy naming a column the table does not have, or a type its
values cannot take, is checked against the source's catalog before a run writes anything
(:func:`pgmedallion.checks.check_column_policies`). Column policies apply from a table's
snapshot on: changing one takes effect with ``pgmedallion resync``.

The password, first found wins: the ``password`` field (set only by code), then the Databricks
secret ``password_secret_scope``/``password_secret_key`` (read when a connection is made, so the
value never sits in the config; off Databricks that is a ``ConfigError``), then the variable
named by ``password_env``, then whatever libpq finds (``~/.pgpass``...). The key of ``pii =
"hash"`` columns comes the same way: ``[source] hash_key_secret_scope``/``hash_key_secret_key``
on Databricks, else the variable named by ``hash_key_env`` (``PGMEDALLION_HASH_KEY``); at least
16 bytes, never in the file, never printed. The snapshot and the stream are filtered by what the
publication publishes and by these policies before bronze is written (``capture.published``);
changing a policy, the key, or the publication's column list or row filter snapshots the table
again.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pgmedallion.core.naming import qualified


def on_databricks() -> bool:
    """Running on a Databricks cluster (its runtime sets this variable)."""
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


DEFAULT_FILE = "pgmedallion.toml"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
ON_ERROR = ("fail", "quarantine", "warn")
TRUNCATE = ("error", "delete")
ON_SCHEMA_CHANGE = ("follow", "resync", "error")
INFINITY = ("clamp", "null", "error")
PII = ("exclude", "hash")
FAILOVER_SLOT = ("auto", "on", "off")
HASH_KEY_MIN_BYTES = 16
TYPE_OVERRIDES = ("string", "double", "float", "bigint", "long", "int", "integer", "smallint")
_DECIMAL = re.compile(r"decimal\((\d{1,2})\s*,\s*(\d{1,2})\)")


def parse_type_override(text: str) -> tuple[str, int, int] | None:
    """``(name, precision, scale)`` of a column type override (precision and scale 0 except for
    ``decimal(p,s)``, 1 <= p <= 38, s <= p), or None for anything else."""
    name = text.strip().lower()
    if name in TYPE_OVERRIDES:
        return name, 0, 0
    match = _DECIMAL.fullmatch(name)
    if match and 1 <= int(match[1]) <= 38 and int(match[2]) <= int(match[1]):
        return "decimal", int(match[1]), int(match[2])
    return None


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ColumnPolicy:
    type: str = ""
    """A type override (see ``silver.pgtypes.override_type``); "" keeps the mapping's type."""
    infinity: str = ""
    """What ``±infinity`` becomes in a date or timestamp column; "" is the table's policy."""
    pii: str = ""
    """Personal data: ``exclude`` (never captured) or ``hash`` (a keyed hash); "" captures it."""


@dataclass(frozen=True)
class TablePolicy:
    on_error: str = "fail"
    truncate: str = "error"
    on_schema_change: str = "follow"
    infinity: str = "clamp"
    history: str = ""
    """``on`` or ``off``: whether the table keeps its history; "": ``[lakehouse] history``."""
    columns: Mapping[str, ColumnPolicy] = field(default_factory=dict)

    def pii(self) -> dict[str, str]:
        """Column -> ``exclude`` or ``hash``, for the columns that have one."""
        return {name: c.pii for name, c in self.columns.items() if c.pii}

    def column(self, name: str) -> ColumnPolicy:
        """The column's policy, its infinity policy falling back to the table's."""
        own = self.columns.get(name, ColumnPolicy())
        return replace(own, infinity=own.infinity or self.infinity)


@dataclass(frozen=True)
class SourceConfig:
    name: str = "pg"
    dsn: str = ""
    host: str = ""
    port: int = 0
    dbname: str = ""
    user: str = ""
    password_env: str = "PGPASSWORD"
    password_secret_scope: str = ""
    password_secret_key: str = ""
    publication: str = "pgmedallion"
    slot: str = "pgmedallion"
    tables: tuple[str, ...] = ()
    create_publication: bool = True
    snapshot_wait_seconds: float = 300.0
    """How long a snapshot (a new table, a resync) waits for transactions open on the server
    to end before it leaves its tables to the next run (0: wait as long as they take)."""
    failover_slot: str = "auto"
    """``auto`` | ``on`` | ``off`` (``true``/``false`` too): the main slot is created as a
    failover slot (``pgmedallion.capture.slot.wants_failover``)."""
    snapshot_range_mb: float = 32.0
    """A table with a one-column integer or uuid key is snapshotted in key ranges of about this
    many MB of heap, each landed on its own, so an interrupted snapshot resumes (0: never)."""
    snapshot_ranges_per_commit: int = 0
    """How many of those ranges one bronze commit lands (0: the writer's choice, one per
    worker locally, four per worker through Spark); a stopped snapshot redoes at most one
    commit's ranges."""
    hash_key_env: str = "PGMEDALLION_HASH_KEY"
    hash_key_secret_scope: str = ""
    hash_key_secret_key: str = ""
    # Set only by code (the demo, tests, Databricks secrets); never read from the file.
    password: str = field(default="", repr=False)

    def conninfo(self) -> dict[str, str]:
        """``psycopg.connect`` keyword arguments; unset keys fall back to libpq's PG* variables."""
        info: dict[str, str] = {}
        if self.dsn:
            from psycopg.conninfo import conninfo_to_dict

            info.update({k: str(v) for k, v in conninfo_to_dict(self.dsn).items()})
        for key in ("host", "dbname", "user"):
            if getattr(self, key):
                info[key] = getattr(self, key)
        if self.port:
            info["port"] = str(self.port)
        password = self.password
        if not password and self.password_secret_scope and self.password_secret_key:
            password = read_databricks_secret(self.password_secret_scope, self.password_secret_key)
        if not password:
            password = os.environ.get(self.password_env, "")
        if password:
            info["password"] = password
        return info

    def hash_key(self) -> bytes:
        """The key of ``pii = "hash"`` columns: the Databricks secret, else the variable."""
        where = f"the variable {self.hash_key_env}"
        if self.hash_key_secret_scope and self.hash_key_secret_key:
            where = "the hash key's secret"
            value = read_databricks_secret(
                self.hash_key_secret_scope, self.hash_key_secret_key, "hash_key"
            )
        else:
            value = os.environ.get(self.hash_key_env, "")
        if len(value.encode()) < HASH_KEY_MIN_BYTES:
            raise ConfigError(
                f'a column has pii = "hash", which needs a key of at least {HASH_KEY_MIN_BYTES} '
                f"bytes in {where} ([source] hash_key_env, or hash_key_secret_scope and "
                "hash_key_secret_key on Databricks)"
            )
        return value.encode()


def read_databricks_secret(scope: str, key: str, what: str = "password") -> str:
    """The value of secret ``key`` in ``scope``, through Databricks' ``dbutils``.

    ``pyspark.dbutils`` exists only in the Databricks runtime (PyPI's pyspark has no such module);
    a notebook's ``dbutils`` global is the fallback. Messages name the scope and key, never a
    value.
    """
    where = f"secret scope {scope!r}, key {key!r}"
    dbutils = _databricks_dbutils()
    if dbutils is None:
        raise ConfigError(
            f"[source] {what}_secret_scope/{what}_secret_key ({where}): secret scopes are "
            "only available on Databricks; off Databricks leave them empty and set the variable "
            f"named by {what}_env instead"
        )
    try:
        value = dbutils.secrets.get(scope=scope, key=key)
    except Exception as e:  # the runtime raises its own (Py4J/IllegalArgument) errors
        raise ConfigError(
            f"could not read the {what} from Databricks {where}: "
            f"{type(e).__name__}: {e} (does the scope exist, and may this job's identity read it?)"
        ) from None
    if not value:
        raise ConfigError(f"Databricks {where} holds an empty {what}")
    return value


def _databricks_dbutils() -> Any:
    """Databricks' ``dbutils``, or ``None`` anywhere else."""
    if "DATABRICKS_RUNTIME_VERSION" not in os.environ:
        return None
    try:
        from pyspark.dbutils import DBUtils  # only in the Databricks runtime
        from pyspark.sql import SparkSession
    except ImportError:
        import __main__

        return getattr(__main__, "dbutils", None)
    spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
    return DBUtils(spark)


@dataclass(frozen=True)
class LakehouseConfig:
    state_dir: str = ".pgmedallion"
    catalog: str = ""
    bronze_schema: str = "pgm_bronze"
    silver_schema: str = "pgm_silver"
    gold_schema: str = "pgm_gold"
    marts: str = ""
    """A folder of Spark Declarative Pipelines definitions run after gold ("": none). Relative
    to the config file when it is read from one (a ``PGMEDALLION_LAKEHOUSE_MARTS`` variable:
    relative to the working directory)."""
    marts_schema: str = "pgm_marts"
    engine: str = "auto"
    """Who reads and commits the tables: ``auto`` (delta-rs for local tables, Spark elsewhere),
    ``spark`` (Spark for every table, as on Databricks) or ``delta-rs`` (as auto, but bronze
    fails rather than fall back to Spark). See ``pgmedallion.core.engine``."""
    workers: int = 4
    """Tables a stage works on at once."""
    small_table_rows: int = 100_000
    """Tables up to this many rows are read and committed through delta-rs (engine auto)."""
    batch_changes: int = 1_000_000
    """Silver runs a local table's changes in the driver (``silver/batch.py``) when its run holds
    at most this many diff rows (a 1% update wave of an 8M-row table under REPLICA IDENTITY
    DEFAULT: 160,000; at 100,000, the default before, it went to Spark and cost 86 s)."""
    history: bool = False
    """Every table keeps its history (``<gold table>__history``, see ``gold.history_table``);
    a table's own ``history`` setting overrides it."""
    history_retention_days: float = 0.0
    """Versions that ended longer ago than this (by their ``__end_at``) are deleted by upkeep
    (``pgmedallion maintain``, a run's upkeep); 0 keeps every version."""
    driver_rows: int = 4_000_000
    """Silver takes a local table's first snapshot in the driver (``silver/first_load.py``), and
    gold builds a local table in full there (Arrow, delta-rs), up to this many rows (a first
    load of 4M rows of eight columns peaked at 4.7 GB); a larger one goes through Spark, gold's
    a bucket of keys at a time."""


ENGINES = ("auto", "delta-rs", "spark")
"""``[lakehouse] engine``'s values (see ``pgmedallion.core.engine``)."""


@dataclass(frozen=True)
class Config:
    source: SourceConfig = SourceConfig()
    lakehouse: LakehouseConfig = LakehouseConfig()
    tables: Mapping[str, TablePolicy] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        return Path(self.lakehouse.state_dir).absolute()

    def policy(self, table: str) -> TablePolicy:
        return self.tables.get(table, TablePolicy())

    def history(self, table: str) -> bool:
        """Whether table ``table`` (``schema.name``) keeps its history."""
        own = self.policy(table).history
        return own == "on" if own else self.lakehouse.history

    def keeps_history(self) -> bool:
        """Whether any table may keep history (silver then records commit times)."""
        return self.lakehouse.history or any(p.history == "on" for p in self.tables.values())

    def qualified(self, layer: str, name: str) -> str:
        """``catalog.schema.name`` (or ``schema.name``) with every part back-quoted."""
        schema = getattr(self.lakehouse, f"{layer}_schema")
        parts = [p for p in (self.lakehouse.catalog, schema, name) if p]
        return qualified(parts)

    def schema(self, layer: str) -> str:
        """A layer's schema, qualified (``catalog.schema`` or ``schema``) and back-quoted."""
        schema = getattr(self.lakehouse, f"{layer}_schema")
        return qualified([p for p in (self.lakehouse.catalog, schema) if p])

    def local_table_path(self, layer: str, name: str) -> str | None:
        """Where the local Spark session (``pgmedallion.core.spark.get_spark(state_dir)``, a Hive
        catalog with its warehouse under the state directory) keeps managed table ``name`` of
        ``layer``: what a process without Spark writes. None on Databricks or with a catalog."""
        if on_databricks() or self.lakehouse.catalog:
            return None
        schema = getattr(self.lakehouse, f"{layer}_schema")
        return str(self.state_dir / "warehouse" / f"{schema.lower()}.db" / name.lower())


def _coerce(section: str, key: str, value: Any, default: Any) -> Any:
    where = f"[{section}] {key}"
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if isinstance(default, int):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be an integer, got {value!r}") from None
    if isinstance(default, float):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
        if isinstance(value, bool) or number < 0 or number != number:
            raise ConfigError(f"{where} must be a number of 0 or more, got {value!r}")
        return number
    if isinstance(default, Mapping):
        return value
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings")
        return tuple(value)
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {type(value).__name__}")
    return value


def _section(cls: type, section: str, raw: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    known = [f.name for f in fields(cls) if f.name != "password"]
    unknown = set(raw) - set(known)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{section}]: {', '.join(sorted(unknown))}")
    obj = cls()
    values = {}
    for name in known:
        env_key = f"PGMEDALLION_{section.upper()}_{name.upper()}"
        if env_key in env:
            values[name] = _coerce(section, name, env[env_key], getattr(obj, name))
        elif name in raw:
            values[name] = _coerce(section, name, raw[name], getattr(obj, name))
    return replace(obj, **values)


def load_config(path: Path | str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (default ``./pgmedallion.toml`` when it exists) and the environment."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    if path is None and Path(DEFAULT_FILE).exists():
        path = DEFAULT_FILE
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    unknown = set(raw) - {"source", "lakehouse", "tables"}
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(sorted(unknown))}")
    raw_source = dict(raw.get("source", {}))
    if isinstance(raw_source.get("failover_slot"), bool):  # failover_slot = true / false
        raw_source["failover_slot"] = "on" if raw_source["failover_slot"] else "off"
    source = _section(SourceConfig, "source", raw_source, env)
    source = replace(source, failover_slot=_failover_slot(source.failover_slot))
    lakehouse = _section(LakehouseConfig, "lakehouse", raw.get("lakehouse", {}), env)
    if lakehouse.engine not in ENGINES:
        raise ConfigError(
            f"[lakehouse] engine must be one of {', '.join(ENGINES)}, got {lakehouse.engine!r}"
        )
    for key in ("workers", "small_table_rows", "batch_changes", "driver_rows"):
        if getattr(lakehouse, key) < 1:
            raise ConfigError(f"[lakehouse] {key} must be at least 1")
    marts_from_file = "PGMEDALLION_LAKEHOUSE_MARTS" not in env
    if lakehouse.marts and path is not None and marts_from_file:
        lakehouse = replace(lakehouse, marts=str(Path(path).parent.absolute() / lakehouse.marts))
    for key in ("name", "publication", "slot"):
        if not _NAME.match(getattr(source, key)):
            raise ConfigError(
                f"[source] {key} must be a plain identifier (letters, digits, _), "
                f"got {getattr(source, key)!r}"
            )
    tables: dict[str, TablePolicy] = {}
    for table, policy in raw.get("tables", {}).items():
        if not isinstance(policy, dict):
            raise ConfigError(f"[tables.{table!r}] must be a table of settings")
        if isinstance(policy.get("history"), bool):  # history = true / false
            policy = {**policy, "history": "on" if policy["history"] else "off"}
        p = _section(TablePolicy, f"tables.{table}", policy, {})
        if p.history not in ("", "on", "off"):
            raise ConfigError(f"[tables.{table!r}] history must be true or false")
        if p.on_error not in ON_ERROR:
            raise ConfigError(f"[tables.{table!r}] on_error must be one of {ON_ERROR}")
        if p.truncate not in TRUNCATE:
            raise ConfigError(f"[tables.{table!r}] truncate must be one of {TRUNCATE}")
        if p.on_schema_change not in ON_SCHEMA_CHANGE:
            raise ConfigError(
                f"[tables.{table!r}] on_schema_change must be one of {ON_SCHEMA_CHANGE}"
            )
        if p.infinity not in INFINITY:
            raise ConfigError(f"[tables.{table!r}] infinity must be one of {INFINITY}")
        tables[table] = replace(p, columns=_column_policies(table, p.columns))
    return Config(source=source, lakehouse=lakehouse, tables=tables)


def _failover_slot(value: str) -> str:
    """``[source] failover_slot`` as ``auto``, ``on`` or ``off``."""
    word = value.strip().lower()
    word = {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off", "0": "off"}.get(
        word, word
    )
    if word not in FAILOVER_SLOT:
        raise ConfigError(f"[source] failover_slot must be auto, on or off, got {value!r}")
    return word


def _column_policies(table: str, raw: Any) -> dict[str, ColumnPolicy]:
    """``[tables."s.t".columns]``: each column a type (a string) or ``{type, infinity}``."""
    where = f"[tables.{table!r}.columns]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table of column = type or {{type, infinity}}")
    out = {}
    for name, value in raw.items():
        key = f"{where} {name}"
        if isinstance(value, str):
            value = {"type": value}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a type name or {{type = ..., infinity = ...}}")
        unknown = set(value) - {"type", "infinity", "pii"}
        if unknown:
            raise ConfigError(f"{key}: unknown key(s) {', '.join(sorted(unknown))}")
        policy = ColumnPolicy(**{k: str(v) for k, v in value.items()})
        if policy.type and parse_type_override(policy.type) is None:
            raise ConfigError(
                f"{key}: unknown type {policy.type!r} (string, double, float, bigint, int, "
                "smallint or decimal(p,s) with p <= 38)"
            )
        if policy.infinity and policy.infinity not in INFINITY:
            raise ConfigError(f"{key}: infinity must be one of {INFINITY}")
        if policy.pii and policy.pii not in PII:
            raise ConfigError(f"{key}: pii must be one of {PII}")
        if policy.pii and (policy.type or policy.infinity):
            raise ConfigError(
                f"{key}: a pii column takes no type or infinity (a hashed one is text, an "
                "excluded one is not captured)"
            )
        out[name] = policy
    return out
