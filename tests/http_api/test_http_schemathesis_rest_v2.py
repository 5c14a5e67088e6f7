"""schemathesis against a live broker: the Confluent REST Proxy v2 operations.
What is proved, and how, is in schemathesis_cases.py."""

from __future__ import annotations

from typing import Any

import pytest
from schemathesis_cases import (  # noqa: F401 - the module-scoped fixtures, used by name
    SHARDS,
    api_schema,
    assert_no_traceback,
    check_operation,
    live_broker,
)

from tests_support import BrokerProcess


@pytest.mark.parametrize("operation_id", SHARDS["rest_v2"])
def test_every_answer_conforms_and_no_5xx(api_schema: Any, operation_id: str) -> None:  # noqa: F811
    check_operation(api_schema, operation_id)


def test_broker_logged_no_traceback(live_broker: BrokerProcess) -> None:  # noqa: F811
    assert_no_traceback(live_broker)
