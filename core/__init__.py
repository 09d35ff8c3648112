"""The foundation every layer stands on; it imports no layer.

``config``        the configuration (TOML, environment, Databricks widgets and secrets)
``spark``         the Spark session: local (Delta, jars, JVM options) or Databricks'
``errors``        the error taxonomy: PipelineError, TransientError, DefiniteError
``naming``        identifiers quoted for Spark SQL; the Delta properties our tables share
``expectations``  data-quality expectations: one implementation for gold and the marts
``failpoints``    named points where tests crash the process (PGMEDALLION_FAILPOINTS)
``parallel``      a bounded thread pool for per-table work
"""
