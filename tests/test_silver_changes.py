"""pgoutput changes to differential updates: layouts, replica identity, TOAST (pure, no Spark)."""

from __future__ import annotations

import pytest

from pgmedallion.capture.pgoutput import (
    UNCHANGED_TOAST,
    Delete,
    Insert,
    Relation,
    RelationColumn,
    Update,
)
from pgmedallion.silver.changes import (
    DISCARDED,
    FILL,
    RETRACT,
    Diff,
    Layout,
    LayoutIndex,
    TableColumn,
    change_diffs,
    plan_columns,
    with_fill,
)
from pgmedallion.silver.errors import SilverError

BASE = [TableColumn("id", 23, -1), TableColumn("body", 25, -1)]


def rel(*cols: tuple[str, int]) -> Relation:
    return Relation(
        16384, "public", "t", "f", tuple(RelationColumn(0, n, oid, -1) for n, oid in cols)
    )


def test_insert_update_delete_become_signed_rows():
    layout = Layout((0, 1))
    assert change_diffs(Insert(1, (b"1", b"a")), layout, 2) == [Diff(1, ["1", "a"])]
    assert change_diffs(Update(1, (b"1", b"a"), "O", (b"1", b"b")), layout, 2) == [
        Diff(-1, ["1", "a"]),
        Diff(1, ["1", "b"]),
    ]
    assert change_diffs(Delete(1, (b"1", None), "O"), layout, 2) == [Diff(-1, ["1", None])]


def test_unchanged_toast_takes_the_old_value():
    layout = Layout((0, 1))
    big = b"x" * 10_000
    out = change_diffs(Update(1, (b"1", big), "O", (b"2", UNCHANGED_TOAST)), layout, 2)
    assert out == [Diff(-1, ["1", big.decode()]), Diff(1, ["2", big.decode()])]


def test_key_only_changes_name_the_row_they_need():
    """REPLICA IDENTITY DEFAULT: the key stands for the old row; 'u' columns are to be filled."""
    layout = Layout((0, 1), keys=(0,))
    assert change_diffs(Update(1, None, None, (b"1", b"b")), layout, 2) == [
        Diff(-1, ["1", None], RETRACT, (0,)),
        Diff(1, ["1", "b"], FILL, ()),
    ]
    assert change_diffs(Update(1, (b"1", None), "K", (b"2", UNCHANGED_TOAST)), layout, 2) == [
        Diff(-1, ["1", None], RETRACT, (0,)),
        Diff(1, ["2", None], FILL, (1,)),
    ]
    assert change_diffs(Delete(1, (b"1", None), "K"), layout, 2) == [
        Diff(-1, ["1", None], RETRACT, (0,))
    ]


@pytest.mark.parametrize(
    "message, layout, code",
    [
        (Update(1, None, None, (b"1", b"b")), Layout((0, 1)), "DefaultReplicaIdentity"),
        (Delete(1, (b"1", None), "K"), Layout((0, 1)), "DefaultReplicaIdentity"),
        (
            Update(1, (b"1", UNCHANGED_TOAST), "O", (b"1", UNCHANGED_TOAST)),
            Layout((0, 1)),
            "MissingToast",
        ),
        (Update(1, None, None, (UNCHANGED_TOAST, b"b")), Layout((0, 1), keys=(0,)), "MissingToast"),
        (Insert(1, (b"1", UNCHANGED_TOAST)), Layout((0, 1)), "MissingToast"),
        (Insert(1, (b"1",)), Layout((0, 1)), "SchemaIncompatible"),
    ],
)
def test_definite_errors(message, layout, code):
    with pytest.raises(SilverError) as err:
        change_diffs(message, layout, 2)
    assert err.value.code == code


def test_relation_key_flags_give_the_layout_its_key():
    key = RelationColumn(1, "id", 23, -1)
    relation = Relation(16384, "public", "t", "d", (RelationColumn(0, "body", 25, -1), key))
    _, layouts = plan_columns(BASE, [(10, relation)])
    assert layouts[0].positions == (1, 0) and layouts[0].keys == (0,)


def test_added_column_widens_the_table_and_earlier_rows_get_null():
    columns, layouts = plan_columns(
        BASE, [(10, rel(("id", 23), ("body", 25))), (20, rel(("id", 23), ("body", 25), ("n", 20)))]
    )
    assert [c.name for c in columns] == ["id", "body", "n"]
    assert change_diffs(Insert(1, (b"1", b"a")), layouts[0], 3) == [Diff(1, ["1", "a", None])]
    assert change_diffs(Insert(1, (b"1", b"a", b"7")), layouts[1], 3) == [Diff(1, ["1", "a", "7"])]


def test_a_column_the_snapshot_has_not_is_left_out_of_changes_before_it():
    """Dropped or no longer published by the snapshot: not added back (as a column of NULLs)."""
    before = rel(("id", 23), ("gone", 25), ("body", 25))
    columns, layouts = plan_columns(BASE, [(10, before)], snapshot_lsn=20)
    assert [c.name for c in columns] == ["id", "body"]
    assert change_diffs(Insert(1, (b"1", b"x", b"a")), layouts[0], 2) == [Diff(1, ["1", "a"])]
    old = Update(1, (b"1", b"x", b"a"), "O", (b"1", b"y", b"b"))
    assert change_diffs(old, layouts[0], 2) == [Diff(-1, ["1", "a"]), Diff(1, ["1", "b"])]


@pytest.mark.parametrize(
    "relation, problem",
    [
        (rel(("id", 23)), "dropped or renamed: body"),
        (rel(("id", 23), ("text", 25)), "dropped or renamed: body"),
        (rel(("id", 20), ("body", 25)), "changed type: id"),
    ],
)
def test_incompatible_relations(relation, problem):
    _, layouts = plan_columns(BASE, [(30, relation)], snapshot_lsn=20)
    assert layouts[0].positions is None and problem in layouts[0].problem
    with pytest.raises(SilverError) as err:
        change_diffs(Insert(1, (b"1",)), layouts[0], 2)
    assert err.value.code == "SchemaIncompatible"


def test_relation_from_before_the_snapshot_may_lack_columns_added_since():
    _, layouts = plan_columns(BASE, [(10, rel(("id", 23)))], snapshot_lsn=20)
    assert layouts[0].positions == (0,)


def test_layout_in_effect_is_the_latest_before_the_change():
    a, b = Layout((0, 1)), Layout((1, 0))
    index = LayoutIndex([((20, 3), b), ((10, 1), a)])
    assert index.at(5, 0) is None
    assert index.at(10, 2) is a
    assert index.at(20, 2) is a
    assert index.at(20, 4) is b
    assert index.at(99, 0) is b


def _numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


def test_a_type_modifier_that_changes_the_spark_type_is_incompatible():
    from pgmedallion.silver.pgtypes import PgType, spark_type

    def target(col: TableColumn):
        return spark_type(PgType(col.type_oid, col.typmod))

    base = [
        TableColumn("id", 23, -1),
        TableColumn("amount", 1700, _numeric(10, 2)),
        TableColumn("name", 1043, 10 + 4),
    ]

    def relation(amount_typmod: int, name_typmod: int) -> Relation:
        return Relation(
            16384,
            "public",
            "t",
            "f",
            (
                RelationColumn(0, "id", 23, -1),
                RelationColumn(0, "amount", 1700, amount_typmod),
                RelationColumn(0, "name", 1043, name_typmod),
            ),
        )

    widened_numeric = relation(_numeric(12, 2), 10 + 4)
    widened_varchar = relation(_numeric(10, 2), 50 + 4)
    _, layouts = plan_columns(base, [(30, widened_numeric), (40, widened_varchar)], 20, target)
    assert layouts[0].positions is None
    assert layouts[0].problem == "column(s) changed type: amount"
    assert layouts[1].positions == (0, 1, 2)  # varchar(10) -> varchar(50): still a string
    # without the Spark types only the type OIDs are compared
    _, layouts = plan_columns(base, [(30, widened_numeric)], 20)
    assert layouts[0].positions == (0, 1, 2)


def test_renamed_and_dropped_columns_are_read_through_their_aliases():
    """A Relation from before a rename gives its column's values under the name of now; one
    from before a drop leaves the column out; a name older than both (a Relation of an earlier
    run, before ``adds_from``) is left out rather than added again."""
    old = rel(("id", 23), ("body", 25), ("gone", 23))
    middle = rel(("id", 23), ("text", 25), ("gone", 23))
    now = rel(("id", 23), ("note", 25))
    renamed = [TableColumn("id", 23, -1), TableColumn("note", 25, -1)]  # silver's, followed
    columns, layouts = plan_columns(
        renamed,
        [(10, old), (20, middle), (30, now)],
        aliases={"body": "note", "text": "note", "gone": ""},
    )
    assert [c.name for c in columns] == ["id", "note"]
    assert [lay.positions for lay in layouts] == [(0, 1, DISCARDED), (0, 1, DISCARDED), (0, 1)]
    # "text" unknown (no alias) in a Relation before adds_from: not a column of the table
    columns, layouts = plan_columns(
        renamed,
        [(10, old), (20, middle), (30, now)],
        aliases={"body": "note", "gone": ""},
        adds_from=25,
    )
    assert [c.name for c in columns] == ["id", "note"]
    assert layouts[2].positions == (0, 1)


def test_a_column_added_with_a_value_fills_rows_of_older_relations():
    layouts = with_fill([Layout((0, 1)), Layout((0, 1, 2)), Layout(None, "x")], [None, None, "7"])
    assert change_diffs(Insert(1, (b"1", b"a")), layouts[0], 3) == [Diff(1, ["1", "a", "7"])]
    assert change_diffs(Insert(1, (b"1", b"a", None)), layouts[1], 3) == [Diff(1, ["1", "a", None])]
    assert layouts[2].positions is None and layouts[2].fill == ()
