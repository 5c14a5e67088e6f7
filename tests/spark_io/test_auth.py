"""Proves spark_io's `token` option against a real `dmq serve --auth on`: a DataFrame
written with the token of a user allowed to write and read topic `sparky` reads back
exactly (driver planning, executor fetches and the sink's producers all authenticate),
and the same read without a token fails with Unauthenticated; the `ca`, `cert` and `key`
options alone reach a broker with TLS and client certificates required.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster.cluster_harness import DmqCluster
from pyspark.sql.types import BinaryType, StructField, StructType

from dmq.dev_certs import write_dev_certs
from tests_support import BrokerProcess

SUPERUSER = "spark-superuser-token-0123456"


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir: Path = tmp_path_factory.mktemp("spark-auth") / "broker"
    broker = BrokerProcess(
        data_dir, extra_args=["--auth", "on"], env={"DMQ_SUPERUSER_TOKEN": SUPERUSER}
    )
    try:
        yield broker.start()
    finally:
        broker.stop()


def _admin(broker: BrokerProcess, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        broker.url + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {SUPERUSER}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req) as answer:
        return json.loads(answer.read())


def test_the_token_option_reads_and_writes_and_none_is_refused(
    spark: Any, auth_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DMQ_TOKEN", raising=False)  # undone after: use_credentials exports it
    _admin(auth_broker, "/v1/topics", {"name": "sparky", "partitions": 2})
    token = _admin(auth_broker, "/v1/auth/users", {"name": "spark"})["token"]
    for op in ("read", "write"):
        _admin(auth_broker, "/v1/acls", {"principal": "User:spark", "resource_type": "topic",
                                         "resource_name": "sparky", "operation": op})  # fmt: skip
    schema = StructType([StructField("value", BinaryType())])
    data = [(f"v{i}".encode(),) for i in range(50)]
    spark.createDataFrame(data, schema).repartition(2).write.format("dmq").option(
        "url", auth_broker.url
    ).option("topic", "sparky").option("token", token).mode("append").save()

    df = spark.read.format("dmq").option("url", auth_broker.url).option("topic", "sparky")
    got = sorted(r.value for r in df.option("token", token).load().select("value").collect())
    assert got == sorted(v for (v,) in data)
    monkeypatch.delenv("DMQ_TOKEN", raising=False)
    with pytest.raises(Exception, match="Unauthenticated"):
        spark.read.format("dmq").option("url", auth_broker.url).option(
            "topic", "sparky"
        ).load().collect()


def test_the_ca_cert_and_key_options_reach_a_tls_broker(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker with TLS and client certificates required: the options alone (no DMQ_CA,
    DMQ_CERT, DMQ_KEY in the environment) carry the write and the read; without the CA
    the read fails on the certificate, and a missing file is refused on the driver."""
    for name in ("DMQ_CA", "DMQ_CERT", "DMQ_KEY"):
        monkeypatch.delenv(name, raising=False)  # undone after: use_credentials exports them
    certs = write_dev_certs(tmp_path / "certs", ["127.0.0.11", "localhost"]).ca.parent
    cluster = DmqCluster(
        tmp_path / "cluster", 1, tls_dir=certs, extra_args=["--tls-client-auth", "required"]
    )
    try:
        node = cluster.start_all()["n1"]
        tls = {
            "ca": str(certs / "ca.pem"),
            "cert": str(certs / "client.pem"),
            "key": str(certs / "client-key.pem"),
        }
        reader = spark.read.format("dmq").option("url", node.url).option("topic", "secure")
        # First, before any client of this process held a TLS connection to it: without
        # the options the system's CAs are used, and the broker's certificate is refused.
        with pytest.raises(Exception, match="certificate verify failed"):
            reader.load().collect()
        schema = StructType([StructField("value", BinaryType())])
        data = [(f"t{i}".encode(),) for i in range(30)]
        spark.createDataFrame(data, schema).write.format("dmq").option("url", node.url).option(
            "topic", "secure"
        ).options(**tls).mode("append").save()
        got = sorted(r.value for r in reader.options(**tls).load().select("value").collect())
        assert got == sorted(v for (v,) in data)
        with pytest.raises(Exception, match="option ca: .* is not a readable file"):
            reader.option("ca", str(tmp_path / "missing.pem")).load().collect()
    finally:
        cluster.close()
