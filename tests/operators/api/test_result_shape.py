"""Issue 34: SPEC §6 ``Result`` is written once, in the wire; the REST document's run shapes
carry exactly its keys, each required, whatever else they add."""

from __future__ import annotations

from dashboard.api.app import api
from delegation.wire import RESULT_KEYS, Result


def components() -> dict:
    return api.get_openapi_schema(path_prefix="/api/")["components"]["schemas"]


def test_it_writes_the_spec_result_once_in_the_wire():
    wire = [info.alias or name for name, info in Result.model_fields.items()]
    assert sorted(wire) == sorted(RESULT_KEYS)
    assert RESULT_KEYS[:13] == (
        "runnerId", "hostInstanceId", "conversationId", "runId", "parentConversationId",
        "parentRunId", "extensionId", "profile", "done", "cancelled", "error", "output", "events",
    )  # fmt: skip


def test_it_gives_rest_the_wire_result_keys_all_required():
    schemas = components()
    result = schemas["RunResult"]
    assert list(result["properties"]) == list(RESULT_KEYS)
    assert set(result["required"]) == set(RESULT_KEYS)
    detail = schemas["RunDetail"]
    assert list(detail["properties"])[: len(RESULT_KEYS)] == list(RESULT_KEYS)
    assert set(RESULT_KEYS) <= set(detail["required"])
    assert detail["properties"]["status"] == result["properties"]["status"]
