"""``pgmedallion demo``: a realistic shop database on the embedded PostgreSQL, then the pipeline.

The schema exercises what a real source has: numeric money amounts, timestamptz, jsonb, arrays,
an enum, bytea, uuid, a text column large enough to be TOASTed, and a quoted mixed-case table.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import threading
from dataclasses import replace
from pathlib import Path

import psycopg

from pgmedallion import marts
from pgmedallion.core.config import Config

DEMO_DB = "shop"
DEMO_MARTS = Path(marts.__file__).parent / "demo"
"""The demo's marts (revenue per day, orders per status) over its gold tables."""
PUBLICATION = "pgmedallion"
TABLES = ("public.customers", "public.products", "public.orders", 'public."OrderItems"')

SCHEMA = """
CREATE TYPE order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE customers (
    id bigint PRIMARY KEY,
    email text NOT NULL UNIQUE,
    name text NOT NULL,
    signed_up timestamptz NOT NULL,
    tags text[] NOT NULL DEFAULT '{}',
    profile jsonb
);
CREATE TABLE products (
    sku uuid PRIMARY KEY,
    title varchar(200) NOT NULL,
    price numeric(12,2) NOT NULL,
    thumbnail bytea,
    description text
);
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers(id),
    status order_status NOT NULL,
    placed_at timestamptz NOT NULL,
    total numeric(14,2) NOT NULL,
    notes text
);
CREATE TABLE "OrderItems" (
    "orderId" bigint NOT NULL,
    "lineNo" int NOT NULL,
    sku uuid NOT NULL,
    quantity int NOT NULL,
    "unitPrice" numeric(12,2) NOT NULL,
    PRIMARY KEY ("orderId", "lineNo")
);
"""


def create_demo_database(conninfo: dict[str, str], *, seed: int = 7, customers: int = 500) -> None:
    """(Re)create the ``shop`` database with its schema and a deterministic initial load."""
    admin = {**conninfo, "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as conn:
        # A database with logical slots cannot be dropped: the demo starts from scratch.
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = %s AND NOT active",
            (DEMO_DB,),
        )
        conn.execute(f"DROP DATABASE IF EXISTS {DEMO_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DEMO_DB}")
    rng = random.Random(seed)
    with psycopg.connect(**{**conninfo, "dbname": DEMO_DB}) as conn:
        conn.execute(SCHEMA)
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO customers VALUES (%s, %s, %s, now() - %s * interval '1 hour', %s, %s)",
                [
                    (
                        i,
                        f"user{i}@example.com",
                        f"Customer {i}",
                        rng.randint(1, 10_000),
                        rng.sample(["vip", "new", "b2b", "eu", "us"], rng.randint(0, 3)),
                        psycopg.types.json.Jsonb(
                            {"newsletter": rng.random() < 0.5, "score": i % 7}
                        ),
                    )
                    for i in range(1, customers + 1)
                ],
            )
            skus = [cur.execute("SELECT gen_random_uuid()").fetchone()[0] for _ in range(100)]
            cur.executemany(
                "INSERT INTO products VALUES (%s, %s, %s, %s, %s)",
                [
                    (
                        sku,
                        f"Product {n}",
                        round(rng.uniform(1, 500), 2),
                        bytes(rng.getrandbits(8) for _ in range(32)),
                        # Large enough to be compressed or moved out of line (TOAST).
                        ("Lorem ipsum " * rng.randint(1, 900)) if n % 3 == 0 else None,
                    )
                    for n, sku in enumerate(skus)
                ],
            )
            order_rows, item_rows = [], []
            for oid in range(1, customers * 3 + 1):
                lines = rng.randint(1, 4)
                items = [
                    (oid, ln, rng.choice(skus), rng.randint(1, 5), round(rng.uniform(1, 500), 2))
                    for ln in range(1, lines + 1)
                ]
                total = sum(q * p for _, _, _, q, p in items)
                order_rows.append(
                    (
                        oid,
                        rng.randint(1, customers),
                        rng.choice(["new", "paid", "shipped", "cancelled"]),
                        rng.randint(1, 5000),
                        round(total, 2),
                        None,
                    )
                )
                item_rows.extend(items)
            cur.executemany(
                "INSERT INTO orders VALUES (%s, %s, %s, now() - %s * interval '1 minute', %s, %s)",
                order_rows,
            )
            cur.executemany('INSERT INTO "OrderItems" VALUES (%s, %s, %s, %s, %s)', item_rows)


def apply_burst(conninfo: dict[str, str], *, seed: int = 11, transactions: int = 200) -> int:
    """Random inserts, updates (TOASTed text included) and deletes over many transactions."""
    rng = random.Random(seed)
    changes = 0
    # autocommit: each conn.transaction() below is a real transaction, not a savepoint.
    with psycopg.connect(**{**conninfo, "dbname": DEMO_DB}, autocommit=True) as conn:
        next_id = conn.execute("SELECT max(id) + 1 FROM orders").fetchone()[0]
        for _ in range(transactions):
            with conn.transaction():
                for _ in range(rng.randint(1, 5)):
                    action = rng.random()
                    if action < 0.4:
                        conn.execute(
                            "INSERT INTO orders VALUES (%s, %s, 'new', now(), %s, %s)",
                            (
                                next_id,
                                rng.randint(1, 500),
                                round(rng.uniform(1, 900), 2),
                                "rush" if rng.random() < 0.2 else None,
                            ),
                        )
                        next_id += 1
                    elif action < 0.8:
                        conn.execute(
                            "UPDATE orders SET status = %s WHERE id = %s",
                            (
                                rng.choice(["paid", "shipped", "cancelled"]),
                                rng.randint(1, next_id - 1),
                            ),
                        )
                    elif action < 0.9:
                        conn.execute(
                            "UPDATE products SET price = price + 1 WHERE sku = "
                            "(SELECT sku FROM products ORDER BY random() LIMIT 1)"
                        )
                    else:
                        conn.execute(
                            'DELETE FROM "OrderItems" WHERE ("orderId", "lineNo") IN '
                            '(SELECT "orderId", "lineNo" FROM "OrderItems" '
                            "ORDER BY random() LIMIT 1)"
                        )
                    changes += 1
    return changes


def demo_config(config: Config, pg) -> Config:
    """The user's config pointed at the embedded server's ``shop`` database."""
    info = pg.conninfo(dbname=DEMO_DB)
    source = replace(
        config.source,
        name="demo",
        dsn="",
        host=info["host"],
        port=int(info["port"]),
        dbname=DEMO_DB,
        user=info["user"],
        password=info["password"],
        publication=PUBLICATION,
        slot="pgmedallion_demo",
        tables=(),
    )
    lakehouse = replace(config.lakehouse, marts=str(DEMO_MARTS))
    return replace(config, source=source, lakehouse=lakehouse)


def run_demo(config: Config) -> int:
    """Embedded PostgreSQL -> shop database -> run -> burst -> run -> verify. 0 iff exact."""
    from pgmedallion.localpg import LocalPostgres

    pg = LocalPostgres(config.state_dir / "postgres")
    was_running = pg.initialised() and pg.is_running()
    pg.start()
    try:
        return _demo(config, pg)
    finally:
        if not was_running:  # nothing the demo starts outlives it
            pg.stop()


DEMO_MARKER = "demo.json"
"""Written in the state directory by the demo: with no config of the user's own, the next
commands in that directory (``status``, ``sql``, ``verify``, ``run``) work on the demo's state,
starting the embedded server for as long as they need it."""


def demo_marker(config: Config):
    return config.state_dir / DEMO_MARKER


def _live(cfg: Config, pg) -> None:
    """A few seconds of ``run --continuous`` seen through ``status --watch``: changes arrive
    while the pipeline runs, and gold follows them without another run."""
    from pgmedallion.continuous import run_continuous
    from pgmedallion.status import watch

    stop, applied = threading.Event(), threading.Event()

    def show() -> None:
        try:
            if applied.wait(300):
                applied.clear()
                changes = apply_burst(pg.conninfo(), seed=13, transactions=50)
                print(f"live: {changes} changes in 50 transactions while it runs")
                if applied.wait(300):
                    watch(cfg, lambda: None, 1.5, stop, sys.stdout, frames=2, clear=False)
        finally:
            stop.set()

    print("live: pgmedallion run --continuous, watched by pgmedallion status --watch")
    shower = threading.Thread(target=show, name="demo-live", daemon=True)
    shower.start()
    result = run_continuous(cfg, stop=stop, on_applied=lambda _: applied.set())
    shower.join()
    print(f"live: stopped cleanly after {len(result.applications)} applications")


def _demo(config: Config, pg) -> int:
    from pgmedallion.core.spark import get_spark
    from pgmedallion.marts.runner import MartsError, format_quality, stop_local_spark
    from pgmedallion.pipeline import open_lakehouse, run_stages, stage_spinner
    from pgmedallion.status import format_rows, status_report
    from pgmedallion.verify import verify

    print(f"embedded PostgreSQL {pg.major} on 127.0.0.1:{pg.port}")
    create_demo_database(pg.conninfo())
    cfg = demo_config(config, pg)
    with psycopg.connect(**pg.conninfo(dbname=DEMO_DB)) as conn:
        for table in TABLES:
            (n,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            print(f"  {table:<24} {n:>7} rows")

    # The demo starts from scratch. A catalog of an earlier run knows its schemas: Spark drops
    # them. In a new directory there is none, and the runs go as `pgmedallion run` goes: Spark
    # starts only where a stage needs it (a local first run does not).
    spark = None
    if (Path(config.state_dir) / "metastore_db").is_dir():
        spark = get_spark(config.state_dir)
        for layer in ("bronze", "silver", "gold", "marts"):
            schema = getattr(cfg.lakehouse, f"{layer}_schema")
            spark.sql(f"DROP SCHEMA IF EXISTS `{schema}` CASCADE")
    for layer in ("bronze", "silver", "gold", "marts"):
        # bronze written by a capture without Spark is an external table: its files stay
        schema = getattr(cfg.lakehouse, f"{layer}_schema")
        stale = Path(cfg.state_dir) / "warehouse" / f"{schema.lower()}.db"
        shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(Path(cfg.state_dir) / "pipelines", ignore_errors=True)
    session = lambda: spark if spark is not None else get_spark(config.state_dir)  # noqa: E731
    layers = ("capture", "silver", "gold")  # the marts run once, at the end
    print("run 1: snapshot, capture, silver, gold")
    run_stages(session, cfg, layers, show=stage_spinner())
    changes = apply_burst(pg.conninfo())
    print(f"applied {changes} random changes in 200 transactions")
    print("run 2: stream the changes through")
    run_stages(session, cfg, layers, show=stage_spinner())
    spark = open_lakehouse(cfg)  # the tables the runs made without Spark put in the catalog
    text, _ = status_report(spark, cfg)
    print(text)
    quality = spark.sql(
        f"SELECT `table`, rule, policy, failed, passed FROM {cfg.qualified('gold', '_quality')} "
        "WHERE run = (SELECT max(run) FROM " + cfg.qualified("gold", "_quality") + ") "
        "ORDER BY `table`, rule"
    ).collect()
    print("quality (last gold run):")
    print(format_rows(["table", "rule", "policy", "failed", "passed"], [tuple(r) for r in quality]))
    result = verify(spark, cfg)
    print(result.report())
    _live(cfg, pg)
    # The marts: a declarative pipeline in a JVM of its own, after this one ends (Derby).
    stop_local_spark()
    print("marts (marts/demo): revenue per day, orders per status, a declarative pipeline")
    try:
        starter = lambda: get_spark(config.state_dir)  # noqa: E731 - never called
        marts_run = run_stages(starter, cfg, ("marts",), show=stage_spinner())
    except MartsError as e:
        print(f"marts failed: {e}")
        return 1
    print(f"marts expectations (rows of {cfg.qualified('marts', '_quality')}):")
    print(format_quality(marts_run.marts.quality))
    demo_marker(config).write_text(json.dumps({"source": cfg.source.name, "dbname": DEMO_DB}))
    gold = cfg.qualified("gold", "public_orders")
    print("next, in this directory (they work on the demo's state):")
    print(f'  pgmedallion sql "SELECT status, count(*) FROM {gold} GROUP BY status"')
    print(f'  pgmedallion sql "SELECT * FROM {cfg.qualified("marts", "daily_revenue")}"')
    print("  pgmedallion status | pgmedallion run | pgmedallion verify")
    return 0 if result.ok else 1
