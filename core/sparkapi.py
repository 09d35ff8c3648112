"""PySpark, imported where it is first used.

A local run reads and writes its tables by delta-rs and decodes and casts over Arrow: it needs
no PySpark, and does not import it (a tenth of a second of every process, and the start of a
JVM's worth of machinery a scheduled local job never uses). The layers name PySpark through
this module: ``F`` and ``T`` stand for ``pyspark.sql.functions`` and ``pyspark.sql.types`` and
load them on first use, and PySpark's classes are attributes of this module, looked up when
code first touches them (``sparkapi.StorageLevel``). Annotations name the classes themselves,
imported under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import importlib
from typing import Any

# where each class this project uses at run time lives in PySpark
_CLASSES = {
    "AnalysisException": "pyspark.errors",
    "Column": "pyspark.sql",
    "DataFrame": "pyspark.sql",
    "Observation": "pyspark.sql",
    "SparkContext": "pyspark",
    "SparkSession": "pyspark.sql",
    "StorageLevel": "pyspark",
}


class _Module:
    """A PySpark module, imported when one of its attributes is first read."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy, pickle, hasattr probes: nothing to import for them
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)

    def __reduce__(self) -> tuple:
        return (_Module, (self._name,))  # a worker function that names F or T pickles

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use>"


F: Any = _Module("pyspark.sql.functions")
T: Any = _Module("pyspark.sql.types")


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        return getattr(importlib.import_module(_CLASSES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
