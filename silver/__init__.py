"""Silver: bronze's raw bytes turned into typed, consolidated differential updates per table.

The contract gold (and anyone querying silver) relies on. Every table lives in the configured
silver schema (``pgm_silver`` by default), all Delta.

``_tables``   one row per (source, table) silver knows about (overwritten each run):
    source STRING, table_oid BIGINT, table_schema STRING, table_name STRING,
    silver_table STRING   the unqualified name of the table's diffs table (and gold table),
    snapshot_lsn BIGINT   the LSN of the table's snapshot (NULL: not snapshotted yet),
    primary_key ARRAY<STRING>, not_null ARRAY<STRING>   source column names,
    columns STRING        JSON list of {name, type_oid, typmod, type_name, spark_type},
    updated_at TIMESTAMP

``<silver_table>``   the table's consolidated diffs (append-only):
    the source columns, in source order, with the source's names and their Spark types
    (column mapping mode ``name``, so any PostgreSQL name works), then
    _lsn BIGINT    commit LSN of the change; 0 = the snapshot (and rewinds)
    _diff BIGINT   signed multiplicity (never 0)
    _run BIGINT    the silver run that appended the row
    The state of the table at frontier F is the multiset sum of all rows with ``_lsn < F``.
    Rows are consolidated within a run; a later run may add rows at an earlier ``_lsn``
    (rewinds at 0 when a table is snapshotted after its changes were seen), so consumers sum.

``_errors``   definite errors, kept forever (append-only):
    source STRING, table_oid BIGINT, table_schema STRING, table_name STRING, lsn BIGINT,
    code STRING   silver's own (``silver/errors.py``): InvalidCopyInput | ColumnCountMismatch |
                  MissingColumn | CastError | InvalidValue | SchemaIncompatible | MissingToast |
                  DefaultReplicaIdentity | UnknownPreviousRow | TableTruncated; and bronze's
                  (``capture/errors.py``): TableDropped | PublicationDropped | SlotCompacted | ...
    column_name STRING, raw STRING, message STRING, run BIGINT, detected_at TIMESTAMP

``_progress``   one row per completed silver run (append-only):
    source STRING, run BIGINT, frontier BIGINT (every transaction committing below it is in
    silver), bronze_batch BIGINT (the last bronze batch read), completed_at TIMESTAMP,
    tables ARRAY<BIGINT> (the OIDs of the tables the run wrote diffs, errors or adjustments
    for; NULL in rows written before the column existed, read as "every table": gold reads
    nothing of a table no run since its last gold run lists), source_time TIMESTAMP (the
    source's clock for the frontier, from bronze's progress record; NULL where unknown)

Compaction (``silver/compact.py``, run by ``pgmedallion.maintain``)
    A table's diffs below the run and frontier gold reported for it are replaced, in one
    commit, by their consolidated form: one row per distinct row value with its summed
    ``_diff`` (zero: gone), its largest ``_lsn`` and the largest ``_run`` among them. Sums and
    last-change LSNs are unchanged; the history below gold's frontier is not kept.

Unsettled rows
    Every value is cast by its type's Arrow kernel (``kernel``), in the driver or in Spark's
    Python workers. On the per-table path, the rows with a decode error, a value that does not
    cast or one a declared rule rounds, clamps or nulls are the table's *unsettled* rows: cast
    again with their error messages, their adjustments counted, and appended in a second commit
    of the run; usually there are none. The driver's paths write a table's run in one commit,
    which stands for both.

Modules (each one job)
    ``build``      the run: :func:`silver.build.run_silver` and one table's run (``table_run``)
    ``plan``       the run's windows (``_plans``) and bronze's control records
    ``catalog``    ``_tables``, Relations and their column layouts, truncates per table
    ``contract``   the DDL of silver's tables and the schemas between its stages
    ``decode``     bronze records -> diff rows (changes and COPY records by Python workers)
    ``changes``    one pgoutput change -> diff rows, and Relation layouts
    ``copy_arrow`` COPY TEXT decoding over Arrow; ``capture.copy_text``: the reference decoder
    ``identity``   previous images of changes by key (REPLICA IDENTITY DEFAULT / USING INDEX)
    ``pgtypes``    PostgreSQL types (``PgType``) and the Spark type each one becomes
    ``kernel``     PostgreSQL text -> typed values or errors over Arrow, one kernel per type
    ``cast_columns``  the kernels on Spark (``mapInArrow``): ``plain_cast``, ``cast_values``
    ``cast_rows``  one table's rows cast: the settled ones, then the unsettled ones
    ``rewind``     rewinds, truncates and consolidation (DataFrame -> DataFrame)
    ``write``      every append of a run (idempotent per run)
    ``errors``     silver's error types and the error record
    ``policies``   per-column policies (type overrides, infinities)
"""
