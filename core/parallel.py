"""Running one function over several items at once, in threads of the driver."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any


def concurrently(fn: Callable[[Any], Any], items: list, workers: int) -> list:
    """``[fn(i) for i in items]``, up to ``workers`` at a time (Spark runs jobs submitted
    from several threads side by side); the first exception is raised once all have ended."""
    if len(items) <= 1 or workers <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        futures = [pool.submit(fn, i) for i in items]
        wait(futures)
    return [f.result() for f in futures]


def side_by_side(*calls: Callable[[], Any], threads: bool = True) -> list:
    """Each of ``calls``' results, in order, the calls made in threads where ``threads``: a
    few independent small reads through Spark (each mostly waiting: a Delta snapshot, a job's
    scheduling) then overlap."""
    return concurrently(lambda call: call(), list(calls), len(calls) if threads else 1)
