"""``core.delta_rs.append_pieces``: a delta-rs write fed piece by piece, each piece read by
delta-rs meanwhile, in one commit; on a single CPU too, where delta-rs' runtime has one worker
unless pgmedallion asks for more (the writer and the reads waited for each other forever)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

SCRIPT = """
import sys
import pyarrow as pa
from pgmedallion.core import delta_rs

source, target = sys.argv[1], sys.argv[2]
schema = pa.schema([("a", pa.int64()), ("b", pa.string())])

def pieces():
    for i in range(5):
        yield delta_rs.read_arrow(source, ["a", "b"], f"a >= {i * 2000} AND a < {(i + 1) * 2000}")

print(delta_rs.append_pieces(target, schema, pieces(), "test-app", 1))
print(delta_rs.append_pieces(target, schema, pieces(), "test-app", 1))
"""


def _tables(tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    write_deltalake(str(source), pa.table({"a": list(range(10000)), "b": ["x"] * 10000}))
    write_deltalake(str(target), pa.table({"a": [-1], "b": ["y"]}))
    return str(source), str(target)


@pytest.mark.parametrize("cpus", ["all", "one"])
def test_pieces_read_by_delta_rs_are_written_in_one_commit(tmp_path, cpus):
    source, target = _tables(tmp_path)
    command = [sys.executable, "-c", SCRIPT, source, target]
    if cpus == "one":
        if shutil.which("taskset") is None:
            pytest.skip("no taskset here")
        command = ["taskset", "-c", "0", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "False"]  # the second is the same commit: skipped
    table = DeltaTable(target)
    assert table.version() == 1  # the creation, then one commit for the five pieces
    assert len(table.to_pyarrow_table()) == 10001


def test_a_piece_that_fails_commits_nothing(tmp_path):
    from pgmedallion.core import delta_rs

    source, target = _tables(tmp_path)

    def pieces():
        yield delta_rs.read_arrow(source, ["a", "b"], "a < 10")
        raise LookupError("the second piece cannot be made")

    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    with pytest.raises(LookupError, match="second piece"):
        delta_rs.append_pieces(target, schema, pieces(), "test-app", 1)
    assert DeltaTable(target).version() == 0
    assert len(DeltaTable(target).to_pyarrow_table()) == 1
