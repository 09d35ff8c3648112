"""The PostgreSQL side of pgmedallion: raw bytes and LSNs out, nothing decoded, no Spark.

A run provisions the main slot, snapshots the tables that need it at one consistent LSN, and
then reads the slot's pgoutput stream up to the WAL position seen at the start of the run (or,
continuously, until stopped).
Everything is yielded as it arrives, raw, for a sink (bronze) to store; the slot is only
acknowledged by the caller, after the sink has committed.

::

    connection.py   connect / connect_replication: pinned text formats, errors as types
         │
    slot.py         ensure_slot ─> slot_state ─> check_resume_point ─> release_slot
         │
    snapshot.py     exported_snapshot (temporary slot, held open)          ──> snapshot_lsn
         │            └─ per table: table_schema_at_snapshot, ctid ranges
         │                 └─ copy_range_chunks (own session, SET TRANSACTION SNAPSHOT)
         │                      ──> raw COPY text, ~1 MiB of whole rows a chunk, time 0
    copy_stream.py     asyncpg reads the COPY in socket-buffer pieces (no Python per row);
         │             psycopg reads it where asyncpg cannot express the conninfo
         │
    replication.py  start_replication ─> read_until(pg_current_wal_lsn())
         │            ──> WalMessage(commit_lsn, ordinal, payload), Keepalive(wal_end)
         │          ack(lsn) <── caller, once bronze committed up to lsn
         │
    progress.py     pg_stat_progress_copy polled from a thread: rows copied / estimated
         │
    errors.py       TransientError (retry) | DefiniteError (record for the table)
    pgoutput.py     the pgoutput protocol: message types by name, decode, LSN formatting

The capture run, which lands all of this in bronze (``pgmedallion.bronze.store`` opens the writer)::

    run.py            capture_once: attempts, retries with backoff, signals, dropped tables
      ├─ land_snapshot.py   every wanted table at one exported snapshot, one bronze commit
      ├─ land_stream.py     the slot in batches; a batch's frontier acked after its commit
      └─ error_records.py   definite errors as bronze ``error`` records, once each
    options.py        CaptureTarget, CaptureOptions, StreamLimits, RetryPolicy, results

Preflight (``pgmedallion doctor``)::

    provision.py         run_checks: server, role, slots, WAL senders, then the modules below
      ├─ publication.py       the tables exist, are readable, and the publication covers them
      ├─ replica_identity.py  replica identity and row security, with safe advice
      └─ preflight.py         CheckResult, Role, TableFacts: what the checks share
"""
