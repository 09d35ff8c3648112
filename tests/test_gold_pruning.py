"""Which tables a gold run skips (``gold.pruning.untouched``): pure, no Spark session."""

from __future__ import annotations

from dataclasses import replace

from pgmedallion.gold.history import Reported
from pgmedallion.gold.pruning import untouched
from pgmedallion.silver.contract import TableInfo

ORDERS = TableInfo(
    oid=16503,
    schema="public",
    name="orders",
    silver_table="public__orders",
    snapshot_lsn=100,
    primary_key=["id"],
    not_null=[],
    columns=[],
    source="shop",
)


def test_a_table_no_silver_run_since_its_report_wrote_for_is_untouched():
    reported = Reported(silver_run=3, frontier=300, rows=10)
    silver_runs = [(3, {16503}), (4, {99}), (5, set())]
    assert untouched(ORDERS, reported, 5, silver_runs, exists=True)


def test_a_table_a_later_silver_run_wrote_for_is_touched():
    reported = Reported(silver_run=3, frontier=300, rows=10)
    assert not untouched(ORDERS, reported, 5, [(4, {99}), (5, {16503})], exists=True)
    # a silver run from before ``_progress`` listed its tables touches every table
    assert not untouched(ORDERS, reported, 4, [(4, None)], exists=True)
    # runs up to the reported one are already in gold
    assert untouched(ORDERS, reported, 4, [(3, {16503}), (4, {99})], exists=True)


def test_without_a_report_a_gold_table_or_after_a_rebuild_a_table_is_touched():
    reported = Reported(silver_run=3, frontier=300, rows=10)
    assert not untouched(ORDERS, None, 5, [], exists=True)
    assert not untouched(ORDERS, reported, 5, [], exists=False)
    assert not untouched(ORDERS, reported, 2, [], exists=True)  # reported beyond the run
    rebuilt = replace(ORDERS, snapshot_run=4)
    assert not untouched(rebuilt, reported, 5, [], exists=True)
    assert untouched(rebuilt, Reported(4, 400, 10), 5, [], exists=True)
