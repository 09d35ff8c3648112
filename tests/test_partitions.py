"""Partitioned tables, as PostgreSQL publishes them: through their root
(``publish_via_partition_root = true``: one gold table per root) or leaf by leaf (``false``).
Rows moving between partitions, and partitions attached or detached later, stay exact."""

from __future__ import annotations

import psycopg
import pytest

from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = """
CREATE TABLE measures (id int, day date, v numeric, note text, PRIMARY KEY (id, day))
    PARTITION BY RANGE (day);
CREATE TABLE measures_2024 PARTITION OF measures FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
CREATE TABLE measures_2025 PARTITION OF measures FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
INSERT INTO measures SELECT g, date '2024-06-01' + (g * 2), g / 3.0, 'n' || g
    FROM generate_series(1, 200) g;
"""


def _count(conninfo, table: str) -> int:
    with psycopg.connect(**conninfo) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


@pytest.mark.parametrize("via_root", [True, False], ids=["via_root", "leaves"])
def test_partitioned_table_stays_exact(spark, db, via_root):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(
            "CREATE PUBLICATION pub FOR TABLE measures"
            f" WITH (publish_via_partition_root = {str(via_root).lower()})"
        )
    cfg = make_config(db, "pt_root" if via_root else "pt_leaves")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)

    def expected() -> dict[str, int]:
        if via_root:
            return {"public.measures": _count(db, "measures")}
        with psycopg.connect(**db) as conn:
            leaves = conn.execute(
                "SELECT relid::regclass::text FROM pg_partition_tree('measures') WHERE isleaf"
            ).fetchall()
        return {f"public.{leaf}": _count(db, leaf) for (leaf,) in leaves}

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE measures SET v = v * 2 WHERE id % 10 = 0")
        # rows moving between partitions: their partition key changes
        conn.execute("UPDATE measures SET day = day + 365 WHERE id BETWEEN 50 AND 60")
        conn.execute("DELETE FROM measures WHERE id BETWEEN 100 AND 105")
        conn.execute("INSERT INTO measures VALUES (1000, '2025-03-03', 1, 'new')")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), expected())

    with psycopg.connect(**db, autocommit=True) as conn:
        # a partition attached with rows in it, and one detached
        conn.execute("CREATE TABLE measures_2026 (LIKE measures INCLUDING ALL)")
        conn.execute("INSERT INTO measures_2026 VALUES (2000, '2026-02-02', 5, 'attached')")
        conn.execute(
            "ALTER TABLE measures ATTACH PARTITION measures_2026"
            " FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')"
        )
        conn.execute("ALTER TABLE measures DETACH PARTITION measures_2024")
        conn.execute("UPDATE measures SET note = 'after' WHERE id = 2000")
        if not via_root:  # leaf by leaf: the detached table is no longer published
            conn.execute("ALTER PUBLICATION pub SET TABLE measures")
    run_stages(spark, cfg)
    result = verify(spark, cfg)
    if via_root:
        assert_exact(result, expected())
    else:
        # the detached table stays what it was when it left; the others are exact
        assert_exact(result, tables=set(expected()))
        assert set(expected()) == {"public.measures_2025", "public.measures_2026"}
