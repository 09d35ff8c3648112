"""Which engine reads and commits the lakehouse's tables, and how much a run does at once.

One setting per process: the configuration's ``[lakehouse]`` section (``engine``, ``workers``,
``small_table_rows``, ``batch_changes``; their meaning and defaults are ``LakehouseConfig``'s),
applied by every entry point (``run_stages``, ``run_silver``, ``run_gold``, ``verify``; capture
takes its engine from ``CaptureTarget``) with :func:`use` before it does anything; the layers
read it through :func:`current`.

``engine``
    ``auto`` (the default): delta-rs (no JVM) reads and commits bronze, and silver's and gold's
    small tables, where they are directories of the local file system; Spark everywhere else
    (Databricks, a catalog, a table delta-rs cannot write). ``spark``: Spark reads and commits
    every table, as on Databricks. ``delta-rs``: as ``auto``, but bronze fails rather than
    fall back to Spark. Either engine is a way to read and write: the rules are the same code.
"""

from __future__ import annotations

from pgmedallion.core.config import LakehouseConfig

_current = LakehouseConfig()


def current() -> LakehouseConfig:
    return _current


def use(lakehouse: LakehouseConfig) -> None:
    """Make ``lakehouse``'s settings this process's."""
    global _current
    _current = lakehouse


def spark_only() -> bool:
    """Whether Spark reads and commits every table (``engine = "spark"``)."""
    return _current.engine == "spark"
