"""Marts: what users build on gold, as Spark Declarative Pipelines datasets."""

GOLD_SCHEMA_KEY = "pgmedallion.gold_schema"
"""The pipeline setting naming gold's schema: set by ``marts.runner.run_marts`` locally and by the
bundle's pipeline resource on Databricks; mart definitions read gold through it."""
