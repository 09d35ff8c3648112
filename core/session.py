"""A Spark session that starts only when something asks it for something.

A scheduled run whose silver and gold work is small and whose tables are local directories
can be done without Spark: delta-rs reads and commits, the rules run over Arrow in the driver.
Starting the JVM, the metastore and the first plans costs more than that whole work (seconds
in a cold process), so ``pgmedallion run`` hands silver and gold a :class:`LazySession`: the
layers take their paths without Spark where they can (see :func:`unstarted`), and the first
thing that needs Spark (a large window, a schema change, a snapshot, a table to create)
starts it, as :func:`pgmedallion.pipeline.run_stages` would have, and goes on with it.
Nothing needs to know in advance whether the run will need Spark.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class LazySession:
    """Stands for the session ``start()`` returns: any attribute asked for starts it (once,
    whatever the thread) and is the session's. ``schemas``: each layer's qualified schema ->
    its local directory, where the session's catalog keeps its managed tables (for the paths
    taken before the session exists)."""

    def __init__(self, start: Callable[[], Any], schemas: dict[str, str]) -> None:
        self._start = start
        self._session = None
        self._lock = threading.Lock()
        self._schemas = dict(schemas)

    @property
    def started(self) -> bool:
        return self._session is not None

    def session(self):
        if self._session is None:
            with self._lock:
                if self._session is None:
                    log.info("starting Spark")
                    log.debug("Spark started for", stack_info=True)
                    self._session = self._start()
        return self._session

    def schema_dir(self, schema: str) -> str | None:
        """The local directory of ``schema`` (qualified, back-quoted) if it is there."""
        path = self._schemas.get(schema)
        return path if path is not None and Path(path).is_dir() else None

    def schema_path(self, schema: str) -> str | None:
        """Where ``schema``'s directory is or will be (for a table made before Spark)."""
        return self._schemas.get(schema)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.session(), name)


def unstarted(spark) -> bool:
    """Whether ``spark`` is a :class:`LazySession` that has not started: then its tables' paths
    come from :meth:`LazySession.schema_dir` and nothing may call into it that a local
    directory can answer."""
    return isinstance(spark, LazySession) and not spark.started


def real(spark):
    """The session itself (a :class:`LazySession` started); for calls that check its type."""
    return spark.session() if isinstance(spark, LazySession) else spark
