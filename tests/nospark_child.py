"""``pgmedallion`` as a user runs it where PySpark (and Delta's Spark package) is not
installed: any import of them fails as if absent. Used by ``tests/test_cli.py``."""

from __future__ import annotations

import importlib.abc
import sys

ABSENT = ("pyspark", "delta", "py4j")


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, _Absent())
    from pgmedallion.cli import main

    code = main(sys.argv[1:])
    assert not [m for m in sys.modules if m.split(".")[0] in ABSENT]
    sys.exit(code)
