"""Gold's expectations: the rules, the per-table policy, and the error a failing run raises.

Rules per gold table (names as they appear in ``<gold schema>._quality``):

``no_definite_errors``         silver's ``_errors`` has no row for the table below the frontier
``values_adjusted``            how many values a declared policy changed (numerics rounded to
                               their Spark decimal, infinities clamped or nulled); always
                               ``warn``: reported, never holding the table
``primary_key_not_null``       no key column is NULL                      (keyed tables)
``primary_key_unique``         a key has at most one row                  (keyed tables)
``not_null_<column>``          the source's NOT NULL columns are not NULL
``multiplicity_not_negative``  no row has a negative multiplicity (a retraction of a row that
                               was never there: a broken invariant, never silently dropped)

The row rules are the same kind of DLT-style expectation as ``pgmedallion.core.expectations`` (a row
fails when its condition is false or NULL); the policy is the table's ``on_error``:

``fail`` (default)  the table is not written this run (it stays at its last good state); the
                    run finishes the other tables, then raises ``GoldQualityError``
``quarantine``      failing rows go to ``<gold schema>.<table>__quarantine`` instead of gold;
                    a definite error holds the table at the state just before its LSN
``warn``            everything that can be rows is applied; the failures are recorded
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core.errors import PipelineError
from pgmedallion.core.expectations import Expectation
from pgmedallion.core.naming import quote

NO_DEFINITE_ERRORS = "no_definite_errors"
VALUES_ADJUSTED = "values_adjusted"
PK_NOT_NULL = "primary_key_not_null"
PK_UNIQUE = "primary_key_unique"
MULT_NOT_NEGATIVE = "multiplicity_not_negative"


@dataclass(frozen=True)
class Check:
    """A row rule's condition, as data: every column of ``not_null`` is not NULL, or the
    integer column ``column`` is at most (``op`` ``<=``) or at least (``>=``) ``bound``. The
    rule's SQL (:meth:`sql`, what Spark evaluates) and its evaluation over Arrow in the driver
    (:meth:`passes`) are both read from it."""

    not_null: tuple[str, ...] = ()
    column: str | None = None
    op: str | None = None
    bound: int = 0

    def sql(self) -> str:
        if self.not_null:
            return " AND ".join(f"{quote(c)} IS NOT NULL" for c in self.not_null)
        return f"{self.column} {self.op} {self.bound}"

    def passes(self, rows: pa.Table) -> np.ndarray:
        """Per row of ``rows``, whether it passes (a NULL comparison fails, as in Spark)."""
        ok = np.ones(rows.num_rows, bool)
        for c in self.not_null:
            ok &= pc.is_valid(rows.column(c)).to_numpy(zero_copy_only=False)
        if self.column is not None:
            compare = pc.less_equal if self.op == "<=" else pc.greater_equal
            result = pc.fill_null(compare(rows.column(self.column), self.bound), False)
            ok &= result.to_numpy(zero_copy_only=False)
        return ok


@dataclass(frozen=True)
class Rule(Expectation):
    """A gold row rule: an expectation whose condition is its :class:`Check`'s SQL (a rule
    made without one has only its SQL, for Spark)."""

    check: Check | None = None


def _rule(name: str, check: Check, policy: str) -> Rule:
    return Rule(name, check.sql(), policy, check)


def row_rules(key: Sequence[str], not_null: Sequence[str], policy: str) -> list[Rule]:
    """The row rules of a table, evaluated on its consolidated state.

    The state carries ``_multiplicity`` and ``_key_rows`` (copies of the row's key with a
    positive multiplicity, see ``pgmedallion.gold.state.with_key_rows``).
    """
    rules: list[Rule] = []
    if key:
        rules.append(_rule(PK_NOT_NULL, Check(not_null=tuple(key)), policy))
        rules.append(_rule(PK_UNIQUE, Check(column="_key_rows", op="<=", bound=1), policy))
    for col in not_null:
        rules.append(_rule(f"not_null_{col}", Check(not_null=(col,)), policy))
    rules.append(_rule(MULT_NOT_NEGATIVE, Check(column="_multiplicity", op=">=", bound=0), policy))
    return rules


@dataclass(frozen=True)
class QualityRecord:
    """One rule's outcome for one table in one run (a row of ``_quality``)."""

    table: str
    rule: str
    policy: str
    failed: int
    passed: int
    sample: str = "[]"


class GoldQualityError(PipelineError):
    """Tables under the ``fail`` policy broke rules; every other table was still processed."""

    def __init__(self, failures: dict[str, list[QualityRecord]], result=None) -> None:
        self.failures = failures
        self.result = result
        parts = [
            f"{table}: "
            + ", ".join(f"{r.rule} ({r.failed} failed)" for r in records)
            + "".join(_definite_error_remedy(table, r) for r in records)
            for table, records in failures.items()
        ]
        super().__init__(
            "gold quality expectations failed (policy 'fail', the tables were not updated): "
            + "; ".join(parts)
        )


def _definite_error_remedy(table: str, record: QualityRecord) -> str:
    """For ``no_definite_errors``: the first error and what takes the table out of it. A
    definite error holds the table until a new snapshot (``resync``) replaces what it broke;
    fixing its cause first (a type override, the truncate policy) keeps it from coming back.
    A dropped table has no way back: nothing is suggested."""
    if record.rule != NO_DEFINITE_ERRORS or not record.failed:
        return ""
    try:
        first = json.loads(record.sample)[0]
    except (ValueError, IndexError, KeyError, TypeError):
        first = {}
    code, message = first.get("code"), first.get("message")
    if len(message or "") > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 1] + "…"
    said = f" (first: {code}: {message})" if code and message else ""
    if code == "TableDropped":
        return said
    policy = f'[tables."{table}"]'
    cause = {
        "TableTruncated": "to follow truncates from now on, set"
        f' truncate = "delete" under {policy}; then ',
        "CastError": "where the values do not fit the column's type, give it an override under"
        f" {policy[:-1]}.columns]; then ",
    }.get(code or "", "")
    return f"{said}; {cause}`pgmedallion resync {shlex.quote(table)}` takes the table again"


MESSAGE_CHARS = 200
"""How much of the first error's message a failed run prints (``_errors`` holds all of it)."""
