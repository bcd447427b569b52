"""SPEC §4 strict input and §5/§6 envelope rules, through real frames on /ws/runner/.

Every refused frame must get the SPEC's code, must not close the socket, and must not change
anything a later read could observe.
"""

import json

import pytest

from delegation.models import Event, Run
from tests.support.rpc import adb
from tests.support.state import assert_all_raw_refused, assert_all_refused, state

pytestmark = pytest.mark.django_db(transaction=True)


async def _refused(client, text: str, rpc_id, code: int) -> dict:
    """Send ``text``, expect error ``code`` for ``rpc_id``; prove nothing changed."""
    before = await state()
    answer = await client.raw_call(text, rpc_id)
    assert answer.get("jsonrpc") == "2.0", answer
    assert "result" not in answer, answer
    assert answer["error"]["code"] == code, answer
    assert isinstance(answer["error"]["message"], str) and answer["error"]["message"]
    assert await state() == before
    # The socket is still open and still current.
    pong = await client.call("no.such.method")
    assert pong["error"]["code"] == -32601
    return answer["error"]


def _frame(method, params=None, rpc_id=1, **extra) -> dict:
    frame = {"jsonrpc": "2.0", "id": rpc_id, "method": method}
    if params is not None:
        frame["params"] = params
    frame.update(extra)
    return frame


# --- -32700: not JSON, trailing data, duplicate keys ------------------------------------------

NOT_JSON = [
    "not json",
    "{",
    '{"jsonrpc": "2.0", "id": 1, "method": "run.open",',
    "   ",
    "{'jsonrpc': '2.0'}",
    '{"jsonrpc":"2.0","id":1,"method":"run.open","params":{"runId":NaN}}',
    '{"jsonrpc":"2.0","id":1,"method":"run.open","params":{"runId":Infinity}}',
    '{"jsonrpc":"2.0","id":1,"method":"run.open","params":{"runId":-Infinity}}',
    '{"jsonrpc":"2.0","id":01,"method":"run.open"}',
    '{"jsonrpc":"2.0","id":1,"method":"run.open",}',
]


async def test_it_answers_32700_for_text_that_is_not_json(runner):
    await assert_all_raw_refused(runner, NOT_JSON, -32700)
    error = await _refused(runner, "not json", None, -32700)
    assert "parse" in error["message"].lower() or "json" in error["message"].lower()


async def test_it_answers_32700_for_trailing_data(runner):
    text = json.dumps(_frame("run.open", {"conversationId": "c", "runId": "r"}))
    suffixes = ["x", "{}", ' {"jsonrpc":"2.0"}', "]", "\n1", ",", "null", "\u0000"]
    await assert_all_raw_refused(runner, [text + suffix for suffix in suffixes], -32700)
    assert await adb(Run.objects.count)() == 0


async def test_it_allows_surrounding_whitespace(runner):
    text = json.dumps(_frame("run.open", {"conversationId": "c", "runId": "r"}, rpc_id=9))
    answer = await runner.raw_call(" \n\t" + text + " \r\n\t ", 9)
    assert answer["result"]["runId"] == "r"


async def test_it_answers_32700_for_a_duplicate_envelope_key(runner):
    text = '{"jsonrpc":"2.0","id":1,"method":"run.open","method":"run.open","params":{"conversationId":"c","runId":"r"}}'
    error = await _refused(runner, text, None, -32700)
    assert "method" in error["message"]


async def test_it_answers_32700_for_a_duplicate_key_deep_inside_params(runner):
    await runner.open("root-1")
    text = (
        '{"jsonrpc":"2.0","id":4,"method":"child.start","params":{"runId":"root-1",'
        '"extensionId":"ext","generation":1,"request":{"requestId":"a","profile":"worker",'
        '"message":"hi","options":{"maxTokens":5,"maxTokens":6}}}}'
    )
    error = await _refused(runner, text, None, -32700)
    assert "maxTokens" in error["message"]
    assert await adb(Run.objects.count)() == 1


async def test_it_answers_32700_for_duplicate_keys_that_differ_only_in_escaping(runner):
    # "runId" and "run\u0049d" are the same key once decoded.
    text = '{"jsonrpc":"2.0","id":1,"method":"run.open","params":{"conversationId":"c","runId":"a","run\\u0049d":"b"}}'
    await _refused(runner, text, None, -32700)


# --- -32600: not a JSON-RPC 2.0 request object, batch ----------------------------------------


async def test_it_refuses_batches_with_32600(runner):
    batches = [
        [],
        [_frame("run.open", {"conversationId": "c", "runId": "r"})],
        [_frame("run.open", {"conversationId": "c", "runId": "r"}, 1), _frame("x", None, 2)],
    ]
    await assert_all_raw_refused(runner, [json.dumps(b) for b in batches], -32600)
    assert await adb(Run.objects.count)() == 0


async def test_it_refuses_a_frame_that_is_not_an_object(runner):
    await assert_all_raw_refused(runner, ["1", '"run.open"', "null", "true", "2.5"], -32600)


async def test_it_refuses_a_wrong_jsonrpc_version_with_32600(runner):
    params = {"conversationId": "c", "runId": "r"}
    frames = [{"id": 1, "method": "run.open", "params": params}] + [
        {"jsonrpc": version, "id": 1, "method": "run.open", "params": params}
        for version in ("1.0", 2.0, 2, "2.0 ", "2", None, ["2.0"])
    ]
    await assert_all_raw_refused(runner, [json.dumps(f) for f in frames], -32600)
    assert await adb(Run.objects.count)() == 0


async def test_it_refuses_a_missing_method_with_32600(runner):
    answer = await runner.raw_call(json.dumps({"jsonrpc": "2.0", "id": 7, "params": {}}), 7)
    assert answer["error"]["code"] == -32600


async def test_it_refuses_a_method_that_is_not_a_string_with_32600(runner):
    frames = [
        {
            "jsonrpc": "2.0",
            "id": 8,
            "method": method,
            "params": {"conversationId": "c", "runId": "r"},
        }
        for method in (5, None, ["run.open"], {"name": "run.open"}, True)
    ]
    await assert_all_raw_refused(runner, [json.dumps(f) for f in frames], -32600)


async def test_it_refuses_an_unknown_envelope_field_with_32600(runner):
    frame = _frame("run.open", {"conversationId": "c", "runId": "r"}, rpc_id=3, auth="secret")
    answer = await runner.raw_call(json.dumps(frame), 3)
    assert answer["error"]["code"] == -32600
    assert "auth" in answer["error"]["message"]
    for extra in ({"Method": "run.open"}, {"result": {}}, {"error": None}):
        frame = {**_frame("run.open", {"conversationId": "c", "runId": "r"}, rpc_id=4), **extra}
        await assert_all_raw_refused(runner, [json.dumps(frame)], -32600)
    assert await adb(Run.objects.count)() == 0


async def test_it_refuses_an_id_that_is_not_a_string_or_number(runner):
    frames = [
        _frame("run.open", {"conversationId": "c", "runId": "r"}, rpc_id=rpc_id)
        for rpc_id in ({"a": 1}, [1], True, False)
    ]
    await assert_all_raw_refused(runner, [json.dumps(f) for f in frames], -32600)
    assert await adb(Run.objects.count)() == 0


@pytest.mark.parametrize("rpc_id", ["abc", 0, 123456789012, "srv-1", ""])
async def test_it_echoes_string_and_integer_ids(runner, rpc_id):
    frame = _frame("run.open", {"conversationId": "c", "runId": "r"}, rpc_id=rpc_id)
    answer = await runner.raw_call(json.dumps(frame), rpc_id)
    assert answer["id"] == rpc_id and answer["result"]["runId"] == "r"


# --- -32601: unknown method --------------------------------------------------------------------


async def test_it_answers_32601_for_an_unknown_method(runner):
    methods = [
        "child.execute",
        "run.cancel",
        "run.steer",
        "lease.revoked",
        "Run.Open",
        "run.open ",
        "child.lease.renew",
        "rpc.discover",
        "",
    ]
    for method in methods:
        before = await state()
        answer = await runner.raw_call(json.dumps(_frame(method, {}, rpc_id="m")), "m")
        assert answer["error"]["code"] == -32601, (method, answer)
        assert answer["id"] == "m"
        assert await state() == before


# --- -32602: params ---------------------------------------------------------------------------


async def test_it_refuses_params_that_are_not_an_object_with_32602(runner):
    cases = [(params, None) for params in ([], ["c", "r"], "c", 1, None, True)]
    await assert_all_refused(runner, "run.open", cases, -32602)


async def test_it_refuses_run_open_params_naming_the_field(runner):
    cases = [
        ({"conversationId": "c", "runId": "r", "apiKey": "sk-1"}, "apiKey"),
        ({"conversationId": "c", "runId": "r", "RunId": "r"}, "RunId"),
        ({"conversationid": "c", "runId": "r"}, "conversationid"),
        ({"conversationId": "c"}, "runId"),
        ({"runId": "r"}, "conversationId"),
        ({"conversationId": 1, "runId": "r"}, "conversationId"),
        ({"conversationId": "c", "runId": "r", "profile": 5}, "profile"),
        ({"conversationId": "c", "runId": "r", "extensionId": None}, "extensionId"),
        ({"conversationId": "c", "runId": "r", "_meta": "x"}, "_meta"),
        ({"conversationId": "", "runId": "r"}, "conversationId"),
        ({"conversationId": "..", "runId": "r"}, "conversationId"),
        ({"conversationId": ".", "runId": "r"}, "conversationId"),
        ({"conversationId": "a/b", "runId": "r"}, "conversationId"),
        ({"conversationId": "a\\b", "runId": "r"}, "conversationId"),
        ({"conversationId": "a b", "runId": "r"}, "conversationId"),
        ({"conversationId": "a\tb", "runId": "r"}, "conversationId"),
        ({"conversationId": "a\u007fb", "runId": "r"}, "conversationId"),
        ({"conversationId": "c" * 129, "runId": "r"}, "conversationId"),
        ({"conversationId": "\u00e9" * 65, "runId": "r"}, "conversationId"),
        ({"conversationId": "c", "runId": "r/1"}, "runId"),
        ({"conversationId": "c", "runId": ""}, "runId"),
    ]
    await assert_all_refused(runner, "run.open", cases, -32602)


async def test_it_accepts_ids_at_the_validid_limits(runner):
    for conv, run_id in (
        ("c" * 128, "r" * 128),
        ("\u00e9" * 64, "\u20ac" * 42),
        ("a.b-c_d:e@f", "~!"),
    ):
        result = await runner.open(run_id, conversation_id=conv)
        assert (result["conversationId"], result["runId"]) == (conv, run_id)


async def test_it_refuses_every_other_method_before_register_with_32001(runner_token, make_client):
    client = await make_client(runner_token, register=False)
    for method, params in [
        ("run.open", {"conversationId": "c", "runId": "r"}),
        ("run.event", {"runId": "r", "from": 1, "events": []}),
        ("run.finish", {"runId": "r"}),
        ("tool.end", {"runId": "r", "toolCallId": "t"}),
        ("child.start", client.child_params("r")),
        ("child.read", client.on_child("c", "r")),
        ("child.cancel", client.on_child("c", "r")),
        ("child.steer", client.on_child("c", "r", message="m", requestId="q")),
        (
            "child.lease.release",
            {"leaseId": "L", "extensionId": "ext", "generation": 1},
        ),
    ]:
        before = await state()
        error = await client.error(method, params)
        assert error["code"] == -32001, (method, error)
        assert await state() == before
    # A refused call never closes the socket: register still works afterwards.
    assert (await client.register())["connectionGeneration"] == 1


# --- notifications and responses ---------------------------------------------------------------


async def test_it_stores_a_valid_notification_without_answering(runner):
    await runner.open("root-1")
    await runner.notify(
        "run.event", {"runId": "root-1", "from": 1, "events": [{"kind": "text", "text": "n"}]}
    )
    # The next request is answered first: nothing was sent for the notification.
    answer = await runner.call("run.event", {"runId": "root-1", "from": 2, "events": []})
    assert answer["result"] == {"emitted": 1, "sequence": 1}


async def test_it_never_answers_a_refused_notification_and_stores_nothing(runner):
    await runner.open("root-1")
    before = await state()
    await runner.notify(
        "run.event", {"runId": "root-1", "from": 1, "events": [{"kind": "text", "bad": 1}]}
    )
    frames = await runner.quiet(0.3)
    assert frames == []
    assert await state() == before


async def test_it_never_answers_a_response_frame(runner):
    before = await state()
    await runner.send_raw(json.dumps({"jsonrpc": "2.0", "id": "srv-999999", "result": {}}))
    await runner.send_raw(json.dumps({"jsonrpc": "2.0", "id": 12, "result": {}}))
    await runner.send_raw(
        json.dumps({"jsonrpc": "2.0", "id": "srv-1", "error": {"code": 1, "message": "x"}})
    )
    assert await runner.quiet(0.3) == []
    assert await state() == before


# --- strings that Python can hold but storage cannot ----------------------------------------


async def test_it_refuses_or_stores_a_lone_surrogate_without_crashing(runner):
    await runner.open("root-1")
    text = (
        '{"jsonrpc":"2.0","id":31,"method":"run.event","params":{"runId":"root-1","from":1,'
        '"events":[{"kind":"text","text":"\\ud800"}]}}'
    )
    await runner.send_raw(text)
    answer = await runner.next_response()
    assert answer["id"] in (31, None)
    if "error" in answer:
        assert answer["error"]["code"] in (-32700, -32602), answer
        assert await adb(Event.objects.count)() == 0
    else:
        assert answer["result"] == {"emitted": 1, "sequence": 1}
    # The socket survives and the stream is consistent with the answer.
    expected = 0 if "error" in answer else 1
    assert (await runner.emit("root-1", [], start=expected + 1))["emitted"] == expected


@pytest.mark.parametrize(
    "method, params",
    [
        ("run.open", '{"conversationId":"c\\udfff","runId":"r"}'),
        ("runner.register", '{"hostInstanceId":"h\\ud800","extensions":[]}'),
    ],
)
async def test_it_refuses_a_lone_surrogate_in_an_identifier(runner, method, params):
    before = await state()
    text = '{"jsonrpc":"2.0","id":32,"method":"' + method + '","params":' + params + "}"
    await runner.send_raw(text)
    answer = await runner.next_response()
    assert answer["id"] in (32, None)
    assert answer.get("error", {}).get("code") in (-32700, -32602), answer
    assert await state() == before


async def test_it_refuses_a_nul_in_an_identifier_without_crashing(runner):
    answer = await runner.call("run.open", {"conversationId": "c\u0000", "runId": "r"})
    assert answer["error"]["code"] == -32602
    assert "conversationId" in answer["error"]["message"]
