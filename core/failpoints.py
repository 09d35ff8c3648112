"""Named crash points for fault-injection tests.

Production code calls :func:`failpoint` at the places where a crash is most interesting
(between a bronze commit and the slot acknowledgement, between silver's plan and its appends,
around gold's MERGE). Nothing happens unless the environment variable
``PGMEDALLION_FAILPOINTS`` names the point::

    PGMEDALLION_FAILPOINTS="bronze.after_commit"        # SIGKILL at the first hit
    PGMEDALLION_FAILPOINTS="bronze.after_commit=3"      # ... at the third hit
    PGMEDALLION_FAILPOINTS="silver.before_append,gold.after_table=2"

The points (``grep -rn 'failpoint("'`` finds them): ``snapshot.copy_chunk`` (per COPY chunk read),
``snapshot.before_commit`` (every range's file written, nothing committed),
``snapshot.range_landed`` (a wave of key ranges committed, ``capture.ranges``),
``snapshot.after_commit`` (committed, the table locks still held), ``bronze.before_commit`` and
``bronze.after_commit`` (a stream batch, around its commit; after it, not yet acknowledged),
``silver.before_append`` and ``silver.after_append`` (around a table's diffs append),
``silver.before_restate`` (a column added with a default: its earlier rows not yet given it),
``gold.after_table`` (one table's MERGE committed) and ``gold.before_reports`` (every table
done, the reports not written).

The process kills itself with SIGKILL, as an OOM killer or a lost machine would: no cleanup,
no ``finally`` blocks, no flushing. Where the snapshot runs as Spark tasks (Databricks), a
failpoint in a task (``snapshot.copy_chunk``) kills only its Python worker, and Spark retries
the task; locally the ranges run in the capture process, which the failpoint kills.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "PGMEDALLION_FAILPOINTS"

_lock = threading.Lock()
_hits: dict[str, int] = {}


def armed() -> dict[str, int]:
    """The armed points and the hit that triggers each (1 = the first)."""
    spec = os.environ.get(ENV, "").strip()
    points: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, nth = item.partition("=")
        try:
            points[name.strip()] = max(1, int(nth)) if nth else 1
        except ValueError as exc:
            raise ValueError(f"{ENV}: {item!r} is not NAME or NAME=N") from exc
    return points


def failpoint(name: str) -> None:
    """SIGKILL this process if ``name`` is armed and this is its triggering hit."""
    if ENV not in os.environ:
        return
    nth = armed().get(name)
    if nth is None:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        hit = _hits[name]
    if hit == nth:
        os.kill(os.getpid(), signal.SIGKILL)
