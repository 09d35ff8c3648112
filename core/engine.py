"""Which engine reads and commits the lakehouse's tables, and how much a run does at once.

One setting per process, from the configuration's ``[lakehouse]`` section (``engine``,
``workers``, ``small_table_rows``, ``batch_changes``; see ``LakehouseConfig``), applied by every
entry point (``capture_once``, ``run_silver``, ``run_gold``, ``run_stages``, ``verify``) with
:func:`use` before it does anything; the layers read it through :func:`current`.

``engine``
    ``auto`` (the default): delta-rs (no JVM) reads and commits bronze, and silver's and gold's
    small tables, where they are directories of the local file system; Spark everywhere else
    (Databricks, a catalog, a table delta-rs cannot write). ``spark``: Spark reads and commits
    every table, as on Databricks. ``delta-rs``: as ``auto``, but bronze fails rather than
    fall back to Spark. Either engine is a way to read and write: the rules are the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("auto", "delta-rs", "spark")


@dataclass(frozen=True)
class Engine:
    engine: str = "auto"
    workers: int = 4
    """Tables a stage works on at once (Spark jobs from threads, delta-rs reads and commits,
    which release the GIL)."""
    small_table_rows: int = 100_000
    """A silver or gold table of at most this many rows is read and committed through delta-rs
    (engine ``auto``), and gold computes its increment in the driver."""
    batch_changes: int = 20_000
    """Silver's batched path (many small tables in a few Spark jobs) takes a table whose run
    holds at most this many changes."""

    @property
    def spark_only(self) -> bool:
        return self.engine == "spark"


_current = Engine()


def current() -> Engine:
    return _current


def use(lakehouse) -> Engine:
    """Make ``lakehouse``'s settings (a ``LakehouseConfig``) this process's."""
    global _current
    _current = Engine(
        engine=lakehouse.engine,
        workers=lakehouse.workers,
        small_table_rows=lakehouse.small_table_rows,
        batch_changes=lakehouse.batch_changes,
    )
    return _current
