"""SPEC §3 depth through the runner socket: carriers, stored levels, and the MaxDepth cap.

Also run.open's Result (SPEC §6 Result: every field always present).
"""

import pytest

from delegation.models import Command, Event, Run, Session
from tests.support.rpc import FORKING_EXTENSION, RESULT_KEYS, adb
from tests.support.state import state

pytestmark = pytest.mark.django_db(transaction=True)

META = "pando:delegationDepth"
MAX = 9223372036854775807


def refusal(level: int, max_depth: int) -> str:
    return (
        f"delegation depth limit reached: level {level} may not spawn (max {max_depth}); "
        "finish the work yourself"
    )


async def _stored_depth(run_id: str) -> tuple[int, int]:
    run = await adb(Run.objects.select_related("session").get)(run_id=run_id)
    return run.depth, run.session.depth


async def test_it_answers_run_open_with_a_complete_result(runner):
    result = await runner.open("root-1", conversation_id="conv-1")
    assert set(result) == RESULT_KEYS
    assert result == {
        "runnerId": "runner-a",
        "hostInstanceId": "host-1",
        "conversationId": "conv-1",
        "runId": "root-1",
        "parentConversationId": "",
        "parentRunId": "",
        "extensionId": "",
        "profile": "",
        "done": False,
        "cancelled": False,
        "error": "",
        "output": "",
        "events": [],
        "depth": 0,
        "status": "running",
        "conclusion": None,
    }


async def test_it_records_profile_and_extension_of_a_top_level_run(runner):
    result = await runner.open("root-1", profile="reviewer", extensionId="ext")
    assert result["profile"] == "reviewer" and result["extensionId"] == "ext"


VALID_META = [
    (2, 2),
    (0, 0),
    (2.0, 2),
    (0.0, 0),
    ("2", 2),
    (" +2 ", 2),
    ("\t7\n", 7),
    ("0005", 5),
    ("+0", 0),
    (MAX, MAX),
    (float(2**52), 2**52),
    (str(MAX), MAX),
]
INVALID_META = [
    True,
    False,
    None,
    {},
    [],
    [1],
    -1,
    1.5,
    -2.0,
    "-1",
    "1.5",
    "1e2",
    "0x10",
    "",
    " ",
    "+",
    "++1",
    "2 2",
    "1_0",
    "\u0662",  # ARABIC-INDIC DIGIT TWO: not ASCII
    "\u00a02",  # NO-BREAK SPACE: not ASCII whitespace
    MAX + 1,
    str(MAX + 1),
    1e300,
]


async def test_it_opens_a_top_level_run_at_the_level_declared_in_meta(runner):
    for n, (value, level) in enumerate(VALID_META):
        result = await runner.open(f"root-{n}", _meta={META: value})
        assert result["depth"] == level, (value, result["depth"])
        assert await _stored_depth(f"root-{n}") == (level, level)


async def test_it_treats_an_invalid_meta_level_as_not_declared(runner_token, make_client):
    # Not declared in _meta: the handshake header (3) applies; without a header, level 0.
    with_header = await make_client(runner_token, depth="3")
    wrong = []
    for n, value in enumerate(INVALID_META):
        result = await with_header.call(
            "run.open", {"conversationId": f"h{n}", "runId": f"h{n}", "_meta": {META: value}}
        )
        if result.get("result", {}).get("depth") != 3:
            wrong.append((value, result))
    plain = await make_client(runner_token)
    for n, value in enumerate(INVALID_META):
        result = await plain.call(
            "run.open", {"conversationId": f"p{n}", "runId": f"p{n}", "_meta": {META: value}}
        )
        if result.get("result", {}).get("depth") != 0:
            wrong.append((value, result))
    assert not wrong


async def test_it_ignores_other_meta_keys(runner):
    result = await runner.open("root-1", _meta={"other": 5, "pando:delegationdepth": 4})
    assert result["depth"] == 0


HEADERS = [
    ("2", 2),
    (" +4 ", 4),
    ("0", 0),
    ("-1", 0),
    ("1.5", 0),
    ("1e2", 0),
    ("0x10", 0),
    ("", 0),
    ("x", 0),
    (str(MAX), MAX),
    (str(MAX + 1), 0),
]


async def test_it_uses_the_handshake_header_when_meta_is_absent(runner_token, make_client):
    for n, (header, level) in enumerate(HEADERS):
        client = await make_client(runner_token, depth=header)
        assert (await client.open(f"root-{n}"))["depth"] == level, header
        await client.close()


async def test_it_prefers_meta_over_the_handshake_header(runner_token, make_client):
    client = await make_client(runner_token, depth="3")
    assert (await client.open("root-1", _meta={META: 1}))["depth"] == 1


async def test_it_never_reads_the_servers_own_environment(runner, monkeypatch):
    monkeypatch.setenv("PANDO_DELEGATION_DEPTH", "2")
    assert (await runner.open("root-1"))["depth"] == 0


async def test_it_keeps_a_sessions_level_for_every_later_run(runner_token, make_client):
    first = await make_client(runner_token)
    await first.open("run-1", conversation_id="conv", _meta={META: 2})
    await first.finish("run-1")
    # Declared lower, higher, or not at all, on another connection with another header:
    # the session's recorded level wins.
    second = await make_client(runner_token, depth="0")
    lower = await second.open("run-2", conversation_id="conv", _meta={META: 0})
    higher = await second.open("run-3", conversation_id="conv", _meta={META: 5})
    silent = await second.open("run-4", conversation_id="conv")
    assert [lower["depth"], higher["depth"], silent["depth"]] == [2, 2, 2]
    assert lower["conversationId"] == "conv" and lower["runId"] == "run-2"
    sessions = await adb(lambda: list(Session.objects.values_list("conversation_id", "depth")))()
    assert sessions == [("conv", 2)]


async def test_it_records_a_run_opened_above_max_depth_and_refuses_its_spawns(runner, settings):
    settings.DELEGATION_MAX_DEPTH = 3
    opened = await runner.open("deep", _meta={META: 7})
    assert opened["depth"] == 7 and opened["status"] == "running"
    error = await runner.error("child.start", runner.child_params("deep"))
    assert error["code"] == -32010
    assert error["message"] == refusal(7, 3)


# --- the chain deeper than MaxDepth --------------------------------------------------------


async def test_it_derives_child_depth_and_refuses_one_level_below_max_depth(runner, settings):
    settings.DELEGATION_MAX_DEPTH = 3
    await runner.open("root-1")
    chain = [{"runId": "root-1", "conversationId": "conv-root-1", "depth": 0}]
    for level in (1, 2, 3):
        parent = chain[-1]
        child = await runner.start(parent["runId"], request_id=f"req-{level}")
        assert child["depth"] == level
        assert child["parentRunId"] == parent["runId"]
        assert child["parentConversationId"] == parent["conversationId"]
        execute = await runner.wait_command("child.execute", depth=level)
        assert execute["params"]["identity"]["runId"] == child["runId"]
        chain.append(child)
    deepest = chain[-1]
    before = await state()
    error = await runner.error("child.start", runner.child_params(deepest["runId"], "req-4"))
    assert error["code"] == -32010
    assert error["message"] == refusal(3, 3)
    # Only the delegation-refused event was recorded, on the refusing parent's stream.
    after = await state()
    assert after["counts"]["Run"] == before["counts"]["Run"] == 4
    assert after["counts"]["Session"] == before["counts"]["Session"]
    assert after["counts"]["Command"] == before["counts"]["Command"]
    assert after["counts"]["Event"] == before["counts"]["Event"] + 1
    read = await runner.read(deepest, run_id=chain[-2]["runId"])
    assert [(e["kind"], e["sequence"]) for e in read["events"]] == [("delegation-refused", 1)]
    assert refusal(3, 3) in (read["events"][0].get("text", "") + read["events"][0].get("error", ""))


async def test_it_records_each_refusal_in_the_parent_stream(runner, settings):
    settings.DELEGATION_MAX_DEPTH = 1
    await runner.open("root-1")
    child = await runner.start()
    for n in range(3):
        error = await runner.error(
            "child.start", runner.child_params(child["runId"], f"deeper-{n}")
        )
        assert error["code"] == -32010
    await runner.emit(child["runId"], ["after the refusals"])
    read = await runner.read(child)
    assert [(e["sequence"], e["kind"]) for e in read["events"]] == [
        (1, "delegation-refused"),
        (2, "delegation-refused"),
        (3, "delegation-refused"),
        (4, "text"),
    ]


async def test_it_disables_delegation_with_max_depth_zero(runner, settings):
    settings.DELEGATION_MAX_DEPTH = 0
    await runner.open("root-1")
    error = await runner.error("child.start", runner.child_params())
    assert error["code"] == -32010
    assert error["message"] == refusal(0, 0)
    assert await adb(Run.objects.count)() == 1


async def test_it_caps_a_chain_that_starts_at_a_declared_level(runner_token, make_client, settings):
    settings.DELEGATION_MAX_DEPTH = 3
    client = await make_client(runner_token, depth="2")
    await client.open("root-1")
    child = await client.start()
    assert child["depth"] == 3
    error = await client.error("child.start", client.child_params(child["runId"], "deeper"))
    assert error["code"] == -32010
    assert error["message"] == refusal(3, 3)


async def test_it_never_lets_a_child_session_be_reopened_at_a_lower_level(runner):
    await runner.open("root-1", _meta={META: 1})
    child = await runner.start()
    assert child["depth"] == 2
    answer = await runner.call(
        "run.open",
        {"conversationId": child["conversationId"], "runId": "sneaky", "_meta": {META: 0}},
    )
    if "result" in answer:
        assert answer["result"]["depth"] == 2
    else:
        assert answer["error"]["code"] in (-32003, -32602)
    sessions = await adb(lambda: dict(Session.objects.values_list("conversation_id", "depth")))()
    assert sessions[child["conversationId"]] == 2


async def test_it_sends_child_execute_with_the_derived_depth(runner):
    await runner.open("root-1", _meta={META: 1})
    child = await runner.start()
    execute = await runner.wait_command("child.execute")
    assert execute["params"]["depth"] == 2 == child["depth"]


# --- resume and fork are capped too ----------------------------------------------------------


async def test_it_caps_resume_and_fork_when_the_parent_may_no_longer_spawn(
    runner_token, make_client, settings
):
    runner = await make_client(runner_token, extensions=[FORKING_EXTENSION])
    settings.DELEGATION_MAX_DEPTH = 3
    await runner.open("root-1", _meta={META: 2})
    child = await runner.start()
    assert child["depth"] == 3
    await runner.finish(child["runId"])
    settings.DELEGATION_MAX_DEPTH = 2
    before = await state()
    resume = await runner.error(
        "child.start", runner.child_params(request_id="again", resume=child["conversationId"])
    )
    assert resume["code"] == -32010
    fork = await runner.error(
        "child.start", runner.child_params(request_id="fork", contextMode="fork")
    )
    assert fork["code"] == -32010
    after = await state()
    assert after["counts"]["Run"] == before["counts"]["Run"]
    assert after["counts"]["Event"] == before["counts"]["Event"] + 2
    kinds = await adb(
        lambda: list(
            Event.objects.filter(run__run_id="root-1")
            .order_by("sequence")
            .values_list("kind", flat=True)
        )
    )()
    assert kinds == ["delegation-refused", "delegation-refused"]


async def test_it_resumes_a_child_at_its_sessions_level_from_a_later_parent_run(runner):
    await runner.open("run-1", conversation_id="conv", _meta={META: 1})
    child = await runner.start("run-1")
    assert child["depth"] == 2
    await runner.finish(child["runId"])
    await runner.finish("run-1")
    # A much later run of the same parent session, declaring a lower level.
    reopened = await runner.open("run-2", conversation_id="conv", _meta={META: 0})
    assert reopened["depth"] == 1
    resumed = await runner.start("run-2", request_id="later", resume=child["conversationId"])
    assert resumed["conversationId"] == child["conversationId"]
    assert resumed["runId"] != child["runId"]
    assert resumed["depth"] == 2
    assert resumed["parentRunId"] == "run-2"


async def test_it_refuses_a_refused_spawn_without_a_command(runner, settings):
    settings.DELEGATION_MAX_DEPTH = 1
    await runner.open("root-1")
    child = await runner.start()
    await runner.wait_command("child.execute")
    commands = await adb(Command.objects.count)()
    error = await runner.error("child.start", runner.child_params(child["runId"], "x"))
    assert error["code"] == -32010
    assert await adb(Command.objects.count)() == commands
    assert len(runner.commands_of("child.execute")) == 1


async def test_it_refuses_a_lease_only_start_when_the_finished_parent_is_at_the_cap(
    runner, settings
):
    settings.DELEGATION_MAX_DEPTH = 3
    await runner.open("root-1", _meta={META: 2})
    first = await runner.start(lease="L1")
    assert first["depth"] == 3
    await runner.finish("root-1")
    # The parent's level is now the cap: the lease alone (no runId) may not spawn either.
    settings.DELEGATION_MAX_DEPTH = 2
    before = await state()
    error = await runner.error("child.start", runner.start_params(None, "via-lease", lease="L1"))
    assert error["code"] == -32010, error
    assert error["message"] == refusal(2, 2)
    after = await state()
    assert after["counts"]["Run"] == before["counts"]["Run"]
    assert after["counts"]["Session"] == before["counts"]["Session"]
    assert after["counts"]["Command"] == before["counts"]["Command"]
    assert after["counts"]["Event"] == before["counts"]["Event"] + 1
    refused = await adb(
        lambda: list(
            Event.objects.filter(run__run_id="root-1", kind="delegation-refused").values_list(
                "text", flat=True
            )
        )
    )()
    assert refused == [refusal(2, 2)]
    # One level up the same lease-only start is admitted: the cap, not the path, refused it.
    settings.DELEGATION_MAX_DEPTH = 3
    admitted = await runner.start(None, "via-lease", lease="L1")
    assert admitted["depth"] == 3 and admitted["parentRunId"] == "root-1"
