"""MCP tool arguments are decoded as strictly as the runner path (SPEC §4, §9): an unknown key,
a wrong type, a null and a NUL are each a −32602 naming the argument, answered in the §9
refusal shape (``isError`` with ``structuredContent`` ``{code, message}``), and change
nothing. Through the official client over real HTTP against a live daphne."""

from __future__ import annotations

import httpx2
import pytest
from asgiref.sync import sync_to_async

from delegation.errors import INVALID_PARAMS, METHOD_NOT_FOUND
from delegation.models import Run
from delegation.services import tokens
from tests.support.mcp_tools import LiveRunner, mcp_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

TASK = {"profile": "worker", "message": "sum 1..9"}

REFUSED = [
    # (tool, arguments, the argument the message must name, the rule it must state)
    ("delegate", {**TASK, "apiKey": "sk-123"}, "arguments.apiKey", "unknown field"),
    ("delegate", {**TASK, "options": None}, "arguments.options", "null"),
    ("delegate", {**TASK, "contextMode": None}, "arguments.contextMode", "null"),
    ("delegate", {**TASK, "requestId": None}, "arguments.requestId", "null"),
    ("delegate", {**TASK, "waitSeconds": "4"}, "arguments.waitSeconds", "valid number"),
    ("delegate", {**TASK, "waitSeconds": True}, "arguments.waitSeconds", "valid number"),
    ("delegate", {**TASK, "message": "a\x00b"}, "arguments.message", "NUL"),
    ("delegate", {**TASK, "options": {"model": "m\x00"}}, "arguments.options.model", "NUL"),
    ("delegate", {**TASK, "options": '{"model": "x"}'}, "arguments.options", "valid dict"),
    ("delegate", {**TASK, "profile": 7}, "arguments.profile", "valid string"),
    ("read_child", {"childId": "c", "waitSecond": 4}, "arguments.waitSecond", "unknown field"),
    ("read_child", {"childId": "c", "waitSeconds": "4"}, "arguments.waitSeconds", "number"),
    ("read_child", {"childId": "c", "waitSeconds": True}, "arguments.waitSeconds", "number"),
    ("read_child", {"childId": "c", "after": "3"}, "arguments.after", "valid integer"),
    ("read_child", {"childId": "c", "after": None}, "arguments.after", "null"),
    ("steer_child", {"childId": "c", "message": "x", "token": "t"}, "arguments.token", "unknown"),
    ("steer_child", {"childId": "c", "message": "a\x00"}, "arguments.message", "NUL"),
    ("cancel_child", {"childId": ["c"]}, "arguments.childId", "valid string"),
    ("list_profiles", {"extensionId": "other"}, "arguments.extensionId", "unknown field"),
]


@pytest.fixture
async def live(daphne_server):
    token = await sync_to_async(tokens.create_runner)("strict-runner")
    async with LiveRunner(daphne_server, token[1]) as runner:
        yield runner


async def test_it_refuses_unknown_mistyped_null_and_nul_arguments_naming_each(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    answers = []
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        for tool, arguments, _, _ in REFUSED:
            answers.append(await mcp.call_tool(tool, arguments))
    for (tool, arguments, where, rule), answer in zip(REFUSED, answers, strict=True):
        case = f"{tool} {arguments!r}: {answer}"
        assert answer.is_error, case
        assert answer.structured_content["code"] == INVALID_PARAMS, case
        message = answer.structured_content["message"]
        assert message.startswith(f"{where}: ") and rule in message, case
        assert "pydantic" not in message and "validation error" not in message, case
        text = answer.content[0].text
        assert text == f"{message} (code {INVALID_PARAMS})", case
    # A tool that does not exist is refused in the same shape (the JSON-RPC code for it).
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        unknown = await mcp.call_tool("delegate_all", {})
    assert unknown.is_error
    assert unknown.structured_content == {
        "code": METHOD_NOT_FOUND,
        "message": "unknown tool 'delegate_all'",
    }
    # Refused calls change nothing: no child was started by any of them.
    children = await sync_to_async(Run.objects.filter(parent__run_id="root-1").count)()
    assert children == 0
    assert not [method for method, _ in live.commands if method == "child.execute"]


async def test_it_publishes_input_schemas_that_refuse_extra_keys_and_null(live):
    await live.open("root-1")
    issued = await live.run_token("root-1")
    async with mcp_session(issued["url"], issued["token"]) as mcp:
        listed = await mcp.list_tools()
        # What the schemas promise holds: a call that keeps to them is served.
        served = await mcp.call_tool("delegate", {**TASK, "options": {"maxTurns": 3}})
    for tool in listed.tools:
        schema = tool.input_schema
        assert schema["additionalProperties"] is False, tool.name
        for name, prop in schema.get("properties", {}).items():
            assert "null" not in str(prop.get("type")) and "anyOf" not in prop, (tool.name, name)
            assert prop.get("description"), (tool.name, name)
    assert not served.is_error, served
    assert served.structured_content["parentRunId"] == "root-1"


DUPLICATED = [
    # (the raw envelope, the key the refusal must name)
    ('{"jsonrpc": "2.0", "id": 1, "method": "ping", "method": "tools/call"}', "method"),
    (
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "delegate",'
        ' "arguments": {"profile": "worker", "message": "a", "message": "b"}}}',
        "message",
    ),
    (
        '{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_profiles",'
        ' "name": "delegate", "arguments": {"profile": "worker", "message": "m"}}}',
        "name",
    ),
]


async def test_it_refuses_an_envelope_with_duplicate_keys_as_a_parse_error(live):
    """Like a runner frame (SPEC §4): the SDK's parser would keep the last of two keys."""
    await live.open("root-1")
    issued = await live.run_token("root-1")
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {issued['token']}",
    }
    async with httpx2.AsyncClient(timeout=10) as http:
        for raw, key in DUPLICATED:
            answer = await http.post(issued["url"], content=raw.encode(), headers=headers)
            assert answer.status_code == 400, (raw, answer.text)
            error = answer.json()["error"]
            assert error["code"] == -32700 and f"duplicate key {key!r}" in error["message"], error
        # The same envelope without the duplicate reaches the SDK and is answered.
        plain = '{"jsonrpc": "2.0", "id": 4, "method": "ping"}'
        answer = await http.post(issued["url"], content=plain.encode(), headers=headers)
        assert answer.status_code == 200, answer.text
    assert await sync_to_async(Run.objects.count)() == 1  # no child was started
