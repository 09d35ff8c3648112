"""The whole pipeline in a process of its own, for the crash trials.

Run as ``python -m tests.pipeline_child SPEC.json`` from the repository root. The spec holds a
pipeline config (``config``: the keyword arguments of ``tests.workload.make_config``) and a
Spark state directory of the child's own (Derby admits one JVM per metastore). The child works
through ``steps`` in order and prints one JSON line per step, flushed, so the parent knows how
far it got before it was killed:

- ``{"do": "recover", "verify": true}``: run the pipeline to completion (failpoints disarmed)
  and verify; prints ``{"step": "recover", "verified": true, "ok": ..., "tables": {name:
  [source, silver, gold, exact]}, "report": ...}``; with ``"verify": false`` only the run,
  printing the frontiers capture, silver and gold reached (``"frontiers"``);
- ``{"do": "wait"}``: read one line from stdin (the parent applies a workload burst first);
- ``{"do": "crash", "failpoints": "silver.after_append=1"}``: arm the failpoints (they are read
  from the environment at every hit) and run the pipeline; prints ``{"step": "armed"}`` first
  and ``{"step": "survived"}`` if no failpoint fired (the parent may SIGKILL it meanwhile).
- ``{"do": "capture_only", ...}``: like ``crash`` but only the capture stage (a timer kill
  during the snapshot COPY or a large streamed transaction is aimed at capture);
- ``{"do": "continuous"}``: ``run --continuous`` until SIGTERM: ``{"step": "armed"}``, one
  ``{"step": "applied", "frontier": ..., "error": ...}`` per application, and at the end
  ``{"step": "stopped", "frontier": <gold's>, "capture": <capture's>, "capture_error": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pgmedallion.core.failpoints import ENV


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(spec_path: str) -> int:
    from pgmedallion.capture.run import RetryPolicy, StreamLimits
    from pgmedallion.core.spark import get_spark
    from pgmedallion.pipeline import run_stages
    from pgmedallion.verify import verify
    from tests.workload import make_config

    spec = json.loads(Path(spec_path).read_text())
    cfg = make_config(**spec["config"])
    spark = get_spark(spec["state_dir"])
    capture = dict(
        retry=RetryPolicy(attempts=5, initial_delay_s=0.2),
        limits=StreamLimits(**spec.get("limits", {})),
    )
    for step in spec["steps"]:
        if step["do"] == "recover":
            os.environ.pop(ENV, None)
            if not step.get("verify", True):
                run = run_stages(spark, cfg, **capture)
                emit(
                    step="recover",
                    verified=False,
                    frontiers={
                        "capture": run.capture.frontier,
                        "silver": run.silver.frontier,
                        "gold": run.gold.frontier,
                    },
                )
                continue
            # verify's catch-up run is the rerun: it brings capture, silver and gold past a
            # fresh snapshot of the source, then compares every table
            result = verify(spark, cfg)
            emit(
                step="recover",
                verified=True,
                ok=result.ok,
                tables={
                    t.table: [t.source_rows, t.silver_rows, t.gold_rows, t.exact and t.gold_exact]
                    for t in result.tables
                },
                report=result.report(),
            )
        elif step["do"] == "continuous":
            from dataclasses import replace

            from pgmedallion.continuous import run_continuous

            # as a process started from a configuration file: capture writes bronze where
            # the session's catalog keeps it, without Spark
            lake = replace(cfg.lakehouse, state_dir=spec["state_dir"])
            cfg = replace(cfg, lakehouse=lake)
            emit(step="armed")
            result = run_continuous(
                cfg,
                on_applied=lambda a: emit(step="applied", frontier=a.frontier, error=a.error),
                **capture,
            )
            emit(
                step="stopped",
                frontier=result.frontier,
                capture=None if result.capture is None else result.capture.frontier,
                capture_error=None if result.capture_error is None else repr(result.capture_error),
            )
        elif step["do"] == "wait":
            sys.stdin.readline()  # the parent has changed the source
        else:
            if step.get("failpoints"):
                os.environ[ENV] = step["failpoints"]
            stages = ("capture",) if step["do"] == "capture_only" else ("capture", "silver", "gold")
            emit(step="armed")
            run_stages(spark, cfg, stages, **capture)
            os.environ.pop(ENV, None)
            emit(step="survived")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
