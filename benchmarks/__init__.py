"""Benchmarks that run pgmedallion and a peer tool side by side, on the same data, in one run.

A figure from a shared 2-core machine means little on its own: another engineer's test suite
can halve it. So every benchmark here times its peer (``psql COPY``, ``pg_recvlogical``,
``spark.read.jdbc``, ...) in the same run on the same data and reports the *ratio*, which is
what the goals are stated in and what RESULTS.md compares across runs.

::

    python -m benchmarks                      every benchmark, default sizes
    python -m benchmarks snapshot --size-mb 64 --peer jdbc
    python -m benchmarks stream --rows 100000 --txns 1000
    python -m benchmarks rss --rows 1000000
    python -m benchmarks load --rows 4000000 --skip-noop
    python -m benchmarks freshness --minutes 30

Each benchmark uses the state directory ``.pgmedallion/bench`` (its own embedded PostgreSQL and
its own Spark warehouse), prints its details and, as its last line, ``NAME: pgmedallion <rate>,
<peer> <rate>, ratio <r> (goal >= <g>)``, and appends the result as one JSON line to
``.pgmedallion/bench/results.jsonl``. The memory benchmark ``rss`` prints peak resident sets
instead: ``rss: pgmedallion peak RSS <mb> MB, pg_recvlogical peak RSS <mb> MB, ratio <ours /
peer> (ours / peer, lower is better; goal pgmedallion <= 256 MB)``.

Adding a benchmark: write ``benchmarks/<name>.py`` with

- ``NAME`` (the command-line name) and ``DESCRIPTION`` (one line),
- ``add_arguments(parser)`` for its own options (sizes, peers) with defaults for a full run,
- ``run(args) -> benchmarks.common.Result`` (or ``MemoryResult``), where ``args.env`` is the
  :class:`benchmarks.common.BenchEnv` (PostgreSQL server, database, lazy Spark session),

and add ``<name>`` to :data:`BENCHMARKS`. :func:`benchmarks.common.execute` does the printing
and the recording.
"""

from __future__ import annotations

import importlib
from types import ModuleType

BENCHMARKS: tuple[str, ...] = (
    "snapshot",
    "stream",
    "silver",
    "incremental",
    "identity",
    "tables",
    "rss",
    "load",
    "resume",
    "freshness",
)
"""The registered benchmarks, in the order ``python -m benchmarks`` runs them."""


def load(name: str) -> ModuleType:
    """The module of the registered benchmark ``name``."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return importlib.import_module(f"benchmarks.{name}")
