"""schemathesis against a live broker: the second half of the /v1 operations (by operationId).
What is proved, and how, is in schemathesis_cases.py."""

from schemathesis_cases import api_schema, live_broker, shard_tests  # noqa: F401 - fixtures

test_every_answer_conforms_and_no_5xx, test_broker_logged_no_traceback = shard_tests(
    "v1_second_half"
)
