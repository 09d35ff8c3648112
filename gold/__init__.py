"""Gold: each source table's current state at a known frontier, with quality expectations.

Entry point: ``pgmedallion.gold.build.run_gold(spark, cfg) -> GoldResult``. It reads only silver's
contract (``silver/__init__.py``) and writes, in the configured gold schema (all Delta):

``<silver_table>``   the table's state at its frontier F: the multiset sum of its silver diffs
    of every silver run up to R (silver's latest completed run, whose frontier is F). The
    source's columns with their names and Spark types (column mapping mode ``name``, deletion
    vectors on), all nullable, then
    _lsn BIGINT   the commit LSN of the row's last change (0 = snapshot)
    A row whose multiplicity is m > 1 appears m times (tables without a primary key).

``<silver_table>__quarantine``   rows kept out of gold (created when first needed):
    the source's columns, _lsn, _multiplicity BIGINT (signed), _rules ARRAY<STRING> (the
    rules the row fails), _run BIGINT (the silver run that put it there). It is part of the
    table's state: a row with a negative multiplicity waits here (under every policy, since it
    cannot be rows) until a later change cancels it, and a quarantined row leaves once its key
    is valid again.

``_frontier``   one row per gold table of the source, replaced by every run:
    source, table_oid, table_schema, table_name, gold_table, frontier (the table's F: the
    state includes exactly the transactions committing below it), silver_run (the silver run
    applied), rows, updated_at, source_time (the source's clock for the frontier, carried from
    capture's progress records through silver's ``_progress``: the table is the source "as of"
    it). A table held back (``fail`` policy, or ``quarantine`` of a definite error) shows the
    frontier it really has (and the clock of the newest silver run not past it).

``_lag``   a view over ``_frontier`` for alerting: per gold table its frontier, as_of,
    updated_at, lag_seconds (now minus as_of), applied_lag_seconds (updated_at minus as_of).

``_quality``   one row per rule, table and run (appended):
    run (the silver run), source, table (``schema.name``), rule, policy, failed, passed,
    sample (JSON list of up to five failing rows), checked_at. Row rules count the distinct
    rows of the state the run recomputed (the touched keys; the whole table on a full build).

Modules (each imports only those listed before it):

``quality``     the rules, the policies, ``GoldQualityError``
``state``       diffs to state: the pure DataFrame transformations (no reads, no writes)
``history``     what a run starts from: silver's runs, frontiers, tables, errors and adjusted
                values; what gold applied (its commits' tag) and last reported (``_frontier``)
``plan``        one table's build: ``Table`` (resolved once), ``plan``, ``TableOutcome``
``pruning``     what a run touches: untouched tables skipped, key ranges and key bitmaps
                that skip gold's files and rows, broadcast hints, clustered full builds
``table_io``    gold's Delta tables: schemas, creation, tagged idempotent commits, the MERGE
``quarantine``  the quarantine table's rows and its write
``reports``     quality records, and the report tables: ``write_frontier``, ``write_quality``
``table``       one table brought to a silver run: new state, checks, commits
``build``       the run: ``run_gold``, ``GoldResult``, exactly-once, tables built concurrently
``ge_suite``    great_expectations suites for ``pgmedallion verify``
"""
