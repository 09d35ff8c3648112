"""Column policies from the configuration, as silver applies them: type overrides and what
``±infinity`` becomes, fixed per column when the table is snapshotted.

A table's columns in ``_tables`` carry their policy (``target``, ``infinity``), so silver, gold
and ``verify`` cast every row of the table the same way until the table is snapshotted again
(``pgmedallion resync``): a policy changed in the file takes effect there, never halfway
through a table's history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pgmedallion.core.config import ConfigError, TablePolicy
from pgmedallion.silver.pgtypes import override_problem, pg_type_of


def column_policy_problems(
    table: str, policy: TablePolicy, columns: Mapping[str, Any]
) -> list[str]:
    """What is wrong with ``table``'s column policies, given its columns (name -> anything
    :func:`pgmedallion.silver.pgtypes.pg_type_of` reads); each problem names its
    configuration key."""
    problems = []
    for name, column_policy in policy.columns.items():
        key = f'[tables."{table}".columns] {name}'
        column = columns.get(name)
        if column is None:
            problems.append(f"{key}: {table} has no column {name!r}")
            continue
        if column_policy.type:
            problem = override_problem(pg_type_of(column), column_policy.type)
            if problem:
                problems.append(f"{key}: {problem}")
    return problems


def with_policies(table: str, policy: TablePolicy, columns: list[dict]) -> list[dict]:
    """``_tables`` column entries with the table's column policies set; a policy that does not
    fit is a :class:`ConfigError` naming its key. (``pii`` policies were applied by capture: an
    excluded column is not among ``columns``, a hashed one is text.)"""
    typed = {name: c for name, c in policy.columns.items() if not c.pii}
    problems = column_policy_problems(
        table, replace(policy, columns=typed), {c["name"]: c for c in columns}
    )
    if problems:
        raise ConfigError("; ".join(problems))
    out = []
    for c in columns:
        own = policy.column(c["name"])
        out.append({**c, "target": own.type, "infinity": own.infinity})
    return out
