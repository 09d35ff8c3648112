"""The demo's marts over its gold tables (``pgmedallion demo`` runs them after gold).

One dataset per file; each file is a thin decorated function over a pure function of
:mod:`pgmedallion.marts.demo.logic`, where the tests reach it without a pipeline.
"""
