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

from collections.abc import Sequence
from dataclasses import dataclass

from pgmedallion.core.errors import PipelineError
from pgmedallion.core.expectations import Expectation
from pgmedallion.core.naming import quote

NO_DEFINITE_ERRORS = "no_definite_errors"
VALUES_ADJUSTED = "values_adjusted"
PK_NOT_NULL = "primary_key_not_null"
PK_UNIQUE = "primary_key_unique"
MULT_NOT_NEGATIVE = "multiplicity_not_negative"

Rule = Expectation


def row_rules(key: Sequence[str], not_null: Sequence[str], policy: str) -> list[Rule]:
    """The row rules of a table, evaluated on its consolidated state.

    The state carries ``_multiplicity`` and ``_key_rows`` (copies of the row's key with a
    positive multiplicity, see ``pgmedallion.gold.state.with_key_rows``).
    """
    rules: list[Rule] = []
    if key:
        rules.append(
            Rule(PK_NOT_NULL, " AND ".join(f"{quote(k)} IS NOT NULL" for k in key), policy)
        )
        rules.append(Rule(PK_UNIQUE, "_key_rows <= 1", policy))
    for col in not_null:
        rules.append(Rule(f"not_null_{col}", f"{quote(col)} IS NOT NULL", policy))
    rules.append(Rule(MULT_NOT_NEGATIVE, "_multiplicity >= 0", policy))
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
            f"{table}: " + ", ".join(f"{r.rule} ({r.failed} failed)" for r in records)
            for table, records in failures.items()
        ]
        super().__init__(
            "gold quality expectations failed (policy 'fail', the tables were not updated): "
            + "; ".join(parts)
        )
