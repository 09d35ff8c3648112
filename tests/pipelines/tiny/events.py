"""A streaming table fed incrementally from a Delta table outside the pipeline."""

from pgmedallion.core.expectations import table


@table(name="events")
def events():
    source = spark.conf.get("tiny.source")  # noqa: F821 - SDP injects `spark`
    return spark.readStream.format("delta").load(source)  # noqa: F821
