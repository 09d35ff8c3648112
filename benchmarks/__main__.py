"""``python -m benchmarks [NAME] [options]``: run one registered benchmark, or all of them.

With a NAME, the options are that benchmark's (``python -m benchmarks NAME --help``). Without
one, every benchmark in :data:`benchmarks.BENCHMARKS` runs with its defaults (only the common
options ``--state-dir`` and ``--no-record`` apply), one after the other in one Spark session.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import BENCHMARKS, load
from benchmarks.common import add_common_arguments, cli_env, execute, module_parser


def spark_packages(args_list: list[argparse.Namespace]) -> tuple[str, ...]:
    """Extra Maven packages the Spark session needs for these runs (the JDBC driver)."""
    if any(getattr(args, "peer", None) == "jdbc" for args in args_list):
        from pgmedallion.core.spark import POSTGRES_JDBC

        return (POSTGRES_JDBC,)
    return ()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        names = [argv.pop(0)]
        try:
            modules = [load(names[0])]
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        parser = argparse.ArgumentParser(
            prog="python -m benchmarks",
            description="Run every benchmark ("
            + ", ".join(BENCHMARKS)
            + ") with its defaults; `python -m benchmarks NAME --help` for one.",
        )
        add_common_arguments(parser)
        parser.parse_args(argv)
        modules = [load(name) for name in BENCHMARKS]
    parsed = [module_parser(module).parse_args(argv) for module in modules]
    env = cli_env(parsed[0], spark_packages(parsed))
    try:
        for module, args in zip(modules, parsed, strict=True):
            args.env = env
            execute(module, args)
    finally:
        env.server.stop()  # the benchmark's own server does not outlive it
    return 0


if __name__ == "__main__":
    sys.exit(main())
