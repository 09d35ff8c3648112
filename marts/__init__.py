"""Marts: what users build on gold, as Spark Declarative Pipelines datasets."""
