"""``core.delta_rs.open_table`` keeps one opened table per path and brings it up to date: it must
always give the table now at the path at its newest version, whoever committed since (another
writer, another process) and even when the table was dropped and created again at the same
path, with as many commits as the one held. Real Delta tables written by delta-rs."""

from __future__ import annotations

import shutil

import pyarrow as pa
from deltalake import write_deltalake

from pgmedallion.core import delta_rs


def _rows(path: str) -> list[int]:
    return sorted(delta_rs.query(str(path), "SELECT x FROM t").column("x").to_pylist())


def _write(path, values: list[int], mode: str = "append") -> None:
    write_deltalake(str(path), pa.table({"x": pa.array(values, pa.int64())}), mode=mode)


def test_an_opened_table_follows_new_commits_and_a_table_created_again(tmp_path):
    path = tmp_path / "t"
    _write(path, [1, 2, 3])
    assert _rows(path) == [1, 2, 3]
    held = delta_rs.open_table(str(path))
    _write(path, [4])  # committed by another writer: the held table is brought up to date
    assert delta_rs.open_table(str(path)) is held
    assert held.version() == 1
    assert _rows(path) == [1, 2, 3, 4]

    # dropped and created again at the same version: another table, read afresh
    shutil.rmtree(path)
    _write(path, [7])
    _write(path, [8])
    assert delta_rs.open_table(str(path)).version() == 1
    assert _rows(path) == [7, 8]

    # dropped and created again with fewer commits than the table held
    shutil.rmtree(path)
    _write(path, [9])
    assert _rows(path) == [9]
    _write(path, [5], mode="overwrite")
    assert _rows(path) == [5]
