"""spark_io: dmq as a Spark source and sink (PySpark 4.x Python Data Source API).

::

    import spark_io

    spark_io.register(spark)
    df = (spark.read.format("dmq").option("url", "http://127.0.0.1:8080")
          .option("topic", "orders").load())

Options, schema, offsets format and limits: spark_io/README.md. spark_io/ is a client of
dmq's HTTP API (tests/test_layering.py): it never imports the broker's layers.
"""

from __future__ import annotations

from typing import Any

from spark_io._options import OptionError
from spark_io._read import DataLossError
from spark_io.source import NAME, DmqDataSource


def register(spark: Any) -> None:
    """Make `format("dmq")` known to this SparkSession (spark.dataSource.register)."""
    spark.dataSource.register(DmqDataSource)


__all__ = ["NAME", "DataLossError", "DmqDataSource", "OptionError", "register"]
