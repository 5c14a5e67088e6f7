"""Fixtures of the Spark tests: one local SparkSession and one real `dmq serve` broker per
test module (a SparkSession takes seconds to start; the broker is cheap but shared likewise).

Spark runs `local[2]` with the project's interpreter for its Python workers
(PYSPARK_PYTHON = sys.executable), no UI, 2 shuffle partitions and warnings-only logs; its
JVM with the first JIT tier only and the serial GC (less CPU for a short-lived JVM).
The broker checks retention every 200 ms so that the data-loss tests need not wait.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import spark_io
from tests_support import BrokerProcess

RETENTION_CHECK_INTERVAL_MS = 200


@pytest.fixture(scope="module")
def dmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("spark-broker") / "broker"
    broker = BrokerProcess(
        data_dir, extra_args=["--retention-check-interval-ms", str(RETENTION_CHECK_INTERVAL_MS)]
    )
    try:
        yield broker.start()
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dmq-spark-io-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(warehouse))
        # The JIT's first tier only and the serial GC: a test session's JVM lives seconds,
        # not long enough for C2's compilations to pay for their CPU (half the JVM's CPU
        # time in test_batch + test_auth; the other pytest worker gets it).
        .config(
            "spark.driver.extraJavaOptions",
            f"-Djava.io.tmpdir={warehouse} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        )
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_io.register(session)
    try:
        yield session
    finally:
        session.stop()
