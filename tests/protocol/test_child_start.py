"""SPEC §4 Request/options rules and §6 child.start: order of checks, presets, idempotency,
caps, resume, fork, cwd confinement and options narrowing, through real frames."""

import pytest

from delegation.models import Command, Run, Session
from tests.support.rpc import (
    DEFAULT_EXTENSION,
    FORKING_EXTENSION,
    RESULT_KEYS,
    adb,
    create_runner_async,
)
from tests.support.state import assert_all_refused, state

pytestmark = pytest.mark.django_db(transaction=True)

KIB = 1024
IDENTITY_KEYS = RESULT_KEYS - {
    "done",
    "cancelled",
    "error",
    "output",
    "events",
    "depth",
    "status",
    "conclusion",
}


async def _refused(runner, params, code, field=None) -> dict:
    """child.start must be refused with ``code`` and change nothing."""
    before = await state()
    error = await runner.error("child.start", params)
    assert error["code"] == code, error
    if field is not None:
        assert field in error["message"], error
    assert await state() == before
    return error


async def _runs() -> int:
    return await adb(Run.objects.count)()


# --- the happy path ---------------------------------------------------------------------------


async def test_it_starts_a_child_and_answers_a_complete_result(runner):
    await runner.open("root-1", conversation_id="conv-root")
    child = await runner.start()
    assert set(child) == RESULT_KEYS
    assert child["runnerId"] == "runner-a"
    assert child["hostInstanceId"] == "host-1"
    assert child["parentConversationId"] == "conv-root"
    assert child["parentRunId"] == "root-1"
    assert child["extensionId"] == "ext"
    assert child["profile"] == "worker"
    assert (child["done"], child["cancelled"], child["error"], child["output"]) == (
        False,
        False,
        "",
        "",
    )
    assert child["events"] == [] and child["depth"] == 1 and child["status"] == "running"
    assert child["conversationId"] and child["runId"]
    assert child["conversationId"] != child["runId"]
    session = await adb(Session.objects.get)(conversation_id=child["conversationId"])
    assert session.depth == 1


async def test_it_sends_child_execute_after_the_identity_is_durable(runner):
    from tests.support.rpc import adb as _adb

    await runner.open("root-1")
    runner.answer_commands = False
    child = await runner.start(systemPrompt="Be brief.")
    execute = await runner.wait_command("child.execute")
    params = execute["params"]
    assert set(params) == {"identity", "request", "preset", "depth"}
    assert params["identity"] == {key: child[key] for key in IDENTITY_KEYS}
    assert params["request"] == {
        "requestId": "req-1",
        "profile": "worker",
        "message": "do the thing",
        "systemPrompt": "Be brief.",
    }
    assert params["preset"] == {"name": "worker", "systemPrompt": "You work."}
    assert params["depth"] == 1
    assert isinstance(execute["id"], str | int)
    # The command is stored (before it is sent) and the child is durable.
    command = await _adb(Command.objects.get)(method="child.execute")
    assert command.params == params and command.answered_at is None
    assert await _adb(Run.objects.filter(run_id=child["runId"]).exists)()
    await runner.send_raw(f'{{"jsonrpc":"2.0","id":{_json(execute["id"])},"result":{{}}}}')
    await runner.quiet(0.2)
    command = await _adb(Command.objects.get)(method="child.execute")
    assert command.answered_at is not None


def _json(value):
    import json

    return json.dumps(value)


async def test_it_freezes_the_preset_with_its_options(runner):
    await runner.open("root-1")
    await runner.start(profile="reviewer")
    execute = await runner.wait_command("child.execute")
    assert execute["params"]["preset"]["name"] == "reviewer"
    assert execute["params"]["preset"]["options"] == {
        "maxTokens": 1000,
        "allowedTools": ["read", "grep"],
    }
    # Re-registering new preset content does not change what the child was given.
    await runner.register(
        extensions=[
            {
                "extensionId": "ext",
                "generation": 1,
                "presets": [{"name": "reviewer", "systemPrompt": "new"}],
            }
        ]
    )
    stored = await adb(Command.objects.get)(method="child.execute")
    assert stored.params["preset"]["options"] == {
        "maxTokens": 1000,
        "allowedTools": ["read", "grep"],
    }


async def test_it_uses_the_conversation_id_as_the_child_id(runner):
    await runner.open("root-1")
    child = await runner.start()
    read = await runner.read(child["conversationId"])
    assert read["runId"] == child["runId"]


# --- strict decoding and Request validation ---------------------------------------------------

BAD_REQUESTS = [
    ({"requestId": ""}, "requestId"),
    ({"requestId": "   "}, "requestId"),
    ({"requestId": "r" * 129}, "requestId"),
    ({"requestId": "\u00e9" * 65}, "requestId"),
    ({"requestId": 1}, "requestId"),
    ({"requestId": None}, "requestId"),
    ({"profile": ""}, "profile"),
    ({"profile": " \t"}, "profile"),
    ({"message": ""}, "message"),
    ({"message": "  \n "}, "message"),
    ({"message": "m" * (512 * KIB + 1)}, "message"),
    ({"message": ["do"]}, "message"),
    ({"systemPrompt": "p" * (256 * KIB + 1)}, "systemPrompt"),
    ({"cwd": "c" * (8 * KIB + 1)}, "cwd"),
    ({"contextMode": "Fork"}, "contextMode"),
    ({"contextMode": "FRESH"}, "contextMode"),
    ({"contextMode": "resume"}, "contextMode"),
    ({"contextMode": None}, "contextMode"),
    ({"contextMode": 0}, "contextMode"),
    ({"resume": None}, "resume"),
    ({"resume": ""}, "resume"),
    ({"resume": "../x"}, "resume"),
    ({"resume": "a/b"}, "resume"),
    ({"resume": "a\\b"}, "resume"),
    ({"resume": "."}, "resume"),
    ({"resume": ".."}, "resume"),
    ({"resume": "a b"}, "resume"),
    ({"resume": "a\u007fb"}, "resume"),
    ({"resume": "r" * 129}, "resume"),
    ({"resume": "c-1", "contextMode": "fork"}, "fork"),
    ({"options": None}, "options"),
    ({"options": []}, "options"),
    ({"options": {"model": None}}, "model"),
    ({"options": {"maxTokens": None}}, "maxTokens"),
    ({"options": {"maxTokens": 0}}, "maxTokens"),
    ({"options": {"maxTokens": -5}}, "maxTokens"),
    ({"options": {"maxTokens": "100"}}, "maxTokens"),
    ({"options": {"maxTokens": 10.0}}, "maxTokens"),
    ({"options": {"weakModelMaxTokens": 0}}, "weakModelMaxTokens"),
    ({"options": {"thinkingBudgetTokens": -1}}, "thinkingBudgetTokens"),
    ({"options": {"maxTurns": -1}}, "maxTurns"),
    ({"options": {"maxTurns": True}}, "maxTurns"),
    ({"options": {"reasoningEffort": "ultra"}}, "reasoningEffort"),
    ({"options": {"reasoningEffort": ""}}, "reasoningEffort"),
    ({"options": {"reasoningEffort": None}}, "reasoningEffort"),
    ({"options": {"useWeakModel": "true"}}, "useWeakModel"),
    ({"options": {"noTools": 1}}, "noTools"),
    ({"options": {"noExtensions": None}}, "noExtensions"),
    ({"options": {"noSkills": "no"}}, "noSkills"),
    ({"options": {"enableFSSearchTools": None}}, "enableFSSearchTools"),
    ({"options": {"allowedTools": [""]}}, "allowedTools"),
    ({"options": {"allowedTools": ["read", "  "]}}, "allowedTools"),
    ({"options": {"allowedTools": "read"}}, "allowedTools"),
    ({"options": {"allowedTools": None}}, "allowedTools"),
    ({"options": {"allowedTools": [None]}}, "allowedTools"),
    ({"options": {"allowedCommands": [""]}}, "allowedCommands"),
    ({"options": {"allowedCommands": [1]}}, "allowedCommands"),
    ({"options": {"model": 4}}, "model"),
    ({"options": {"apiKey": "sk-live"}}, "apiKey"),
    ({"options": {"baseUrl": "https://evil"}}, "baseUrl"),
    ({"options": {"endpoint": "https://evil"}}, "endpoint"),
    ({"options": {"MaxTokens": 5}}, "MaxTokens"),
    ({"apiKey": "sk-live"}, "apiKey"),
    ({"provider": {"secret": "x"}}, "provider"),
    ({"systemPromptPath": "/etc/prompt"}, "systemPromptPath"),
    ({"configPath": "/home/u/.config"}, "configPath"),
    ({"RequestId": "again"}, "RequestId"),
    ({"Message": "again"}, "Message"),
    ({"leaseId": ""}, "leaseId"),
]


async def test_it_refuses_an_invalid_request_with_32602_naming_the_field(runner):
    await runner.open("root-1")
    cases = []
    for change, field in BAD_REQUESTS:
        params = runner.child_params()
        params["request"].update(change)
        cases.append((params, field))
    for missing in ("requestId", "profile", "message"):
        params = runner.child_params()
        del params["request"][missing]
        cases.append((params, missing))
    await assert_all_refused(runner, "child.start", cases, -32602)


BAD_PARAMS = [
    ({"generation": 0}, "generation"),
    ({"generation": -1}, "generation"),
    ({"generation": "1"}, "generation"),
    ({"generation": 1.0}, "generation"),
    ({"generation": True}, "generation"),
    ({"generation": None}, "generation"),
    ({"extensionId": 5}, "extensionId"),
    ({"request": None}, "request"),
    ({"request": "do it"}, "request"),
    ({"request": []}, "request"),
    ({"runId": 1}, "runId"),
    ({"toolCallId": 1}, "toolCallId"),
    ({"apiKey": "sk"}, "apiKey"),
    ({"RunId": "root-1"}, "RunId"),
    ({"leaseId": "a/b"}, "leaseId"),
    ({"childRunId": None}, "childRunId"),
]


async def test_it_refuses_invalid_params_with_32602(runner):
    await runner.open("root-1")
    cases = []
    for change, field in BAD_PARAMS:
        params = runner.child_params()
        params.update(change)
        cases.append((params, field))
    for missing in ("extensionId", "generation", "request"):
        params = runner.child_params()
        del params[missing]
        cases.append((params, missing))
    await assert_all_refused(runner, "child.start", cases, -32602)


async def test_it_accepts_every_boundary_value(runner):
    await runner.open("root-1")
    child = await runner.start(
        request_id="r" * 128,
        message="m" * 512 * KIB,
        systemPrompt="p" * 256 * KIB,
        cwd="c" * 8 * KIB,
        contextMode="",
        options={
            "model": "m1",
            "weakModel": "m0",
            "maxTokens": 1,
            "weakModelMaxTokens": 1,
            "thinkingBudgetTokens": 0,
            "reasoningEffort": " HIGH ",
            "maxTurns": 0,
            "useWeakModel": True,
            "noTools": True,
            "noExtensions": False,
            "noSkills": True,
            "allowedTools": [],
            "allowedCommands": ["ls"],
            "enableFSSearchTools": False,
        },
    )
    stored = await adb(Run.objects.get)(run_id=child["runId"])
    assert stored.context_mode == "fresh"
    # reasoningEffort is trimmed and case-folded; [] (deny all tools) is kept, not dropped.
    assert stored.options["reasoningEffort"] == "high"
    assert stored.options["allowedTools"] == []
    assert stored.options["maxTurns"] == 0


async def test_it_accepts_every_reasoning_effort(runner, settings):
    settings.DELEGATION_MAX_CONCURRENT = 100
    await runner.open("root-1")
    efforts = ["none", "minimal", "low", "medium", "high", "xhigh", "max", "Max", "\tLow ", "HIGH"]
    for n, effort in enumerate(efforts):
        child = await runner.start(request_id=f"e{n}", options={"reasoningEffort": effort})
        stored = await adb(Run.objects.get)(run_id=child["runId"])
        assert stored.options["reasoningEffort"] == effort.strip().lower()


# --- order of checks ---------------------------------------------------------------------------


async def test_it_decodes_strictly_before_checking_authority(runner):
    await runner.open("root-1")
    params = runner.child_params(run_id="no-such-run")
    params["surprise"] = 1
    await _refused(runner, params, -32602, "surprise")


async def test_it_checks_authority_before_validating_the_request(runner):
    await runner.open("root-1")
    params = runner.child_params(run_id="no-such-run", message="")
    await _refused(runner, params, -32004)


async def test_it_validates_the_request_before_the_preset(runner):
    await runner.open("root-1")
    params = runner.child_params(profile="no-such-preset", message="  ")
    await _refused(runner, params, -32602, "message")


async def test_it_checks_the_preset_before_the_lease_id(runner):
    await runner.open("root-1")
    params = runner.child_params(profile="no-such-preset")
    params["leaseId"] = "L1"  # request.leaseId absent: mismatched
    await _refused(runner, params, -32012)


async def test_it_checks_the_lease_id_before_idempotency(runner):
    await runner.open("root-1")
    await runner.start()
    params = runner.child_params(leaseId="L1")  # same requestId, leaseId only in the request
    await _refused(runner, params, -32602, "leaseId")


async def test_it_checks_idempotency_before_the_depth_cap(runner, settings):
    await runner.open("root-1", _meta={"pando:delegationDepth": 2})
    child = await runner.start()
    settings.DELEGATION_MAX_DEPTH = 2
    again = await runner.start()
    assert again["runId"] == child["runId"]
    await _refused(runner, runner.child_params(message="other"), -32013)


async def test_it_checks_the_depth_cap_before_the_admission_caps(runner, settings):
    settings.DELEGATION_MAX_CONCURRENT = 1
    await runner.open("root-1", _meta={"pando:delegationDepth": 2})
    await runner.start()
    assert (await runner.error("child.start", runner.child_params(request_id="b")))[
        "code"
    ] == -32011
    settings.DELEGATION_MAX_DEPTH = 2
    error = await runner.error("child.start", runner.child_params(request_id="b"))
    assert error["code"] == -32010


# --- authority ----------------------------------------------------------------------------------


async def test_it_refuses_an_unknown_parent_run_with_32004(runner):
    await runner.open("root-1")
    await _refused(runner, runner.child_params(run_id="ghost"), -32004)


async def test_it_refuses_another_runners_parent_run_with_32004(runner, make_client):
    await runner.open("root-1")
    other = await make_client(await create_runner_async("runner-b"))
    await _refused(other, other.child_params(run_id="root-1"), -32004)


async def test_it_refuses_a_finished_parent_with_32014(runner):
    await runner.open("root-1")
    await runner.finish("root-1")
    await _refused(runner, runner.child_params(), -32014)


@pytest.mark.parametrize("status", [{"cancelled": True}, {"error": "x"}, {}])
async def test_it_refuses_a_child_of_a_finished_child_with_32014(runner, status):
    await runner.open("root-1")
    child = await runner.start()
    await runner.finish(child["runId"], **status)
    await _refused(runner, runner.child_params(run_id=child["runId"], request_id="g"), -32014)


# --- presets ------------------------------------------------------------------------------------


async def test_it_refuses_an_unknown_profile_with_32012(runner):
    await runner.open("root-1")
    error = await _refused(runner, runner.child_params(profile="ghost"), -32012)
    assert "execution preset absent or stale" in error["message"]


async def test_it_refuses_an_unknown_extension_with_32012(runner):
    await runner.open("root-1")
    params = runner.child_params()
    params["extensionId"] = "other-ext"
    await _refused(runner, params, -32012)


async def test_it_refuses_a_wrong_generation_with_32012(runner):
    await runner.open("root-1")
    params = runner.child_params()
    params["generation"] = 2
    await _refused(runner, params, -32012)


async def test_it_refuses_a_preset_made_stale_by_a_new_generation(runner):
    await runner.open("root-1")
    await runner.register(extensions=[{**DEFAULT_EXTENSION, "generation": 2}])
    await _refused(runner, runner.child_params(), -32012)
    params = runner.child_params()
    params["generation"] = 2
    assert (await runner.ok("child.start", params))["profile"] == "worker"


async def test_it_refuses_a_profile_of_another_extension_with_32012(runner_token, make_client):
    client = await make_client(
        runner_token,
        extensions=[
            DEFAULT_EXTENSION,
            {"extensionId": "ext2", "generation": 1, "presets": [{"name": "special"}]},
        ],
    )
    await client.open("root-1")
    await _refused(client, client.child_params(profile="special"), -32012)


# --- request.leaseId must equal leaseId ------------------------------------------------------


@pytest.mark.parametrize(
    "params_lease, request_lease",
    [("L1", None), (None, "L1"), ("L1", "L2")],
)
async def test_it_refuses_a_lease_id_mismatch_with_32602(runner, params_lease, request_lease):
    await runner.open("root-1")
    params = runner.child_params()
    if params_lease is not None:
        params["leaseId"] = params_lease
    if request_lease is not None:
        params["request"]["leaseId"] = request_lease
    await _refused(runner, params, -32602, "leaseId")


# --- idempotency ------------------------------------------------------------------------------


async def test_it_answers_a_replay_with_the_same_child(runner):
    await runner.open("root-1")
    first = await runner.start()
    await runner.wait_command("child.execute")
    before = await state()
    again = await runner.start()
    assert again["runId"] == first["runId"]
    assert again["conversationId"] == first["conversationId"]
    assert await state() == before
    await runner.quiet(0.2)
    assert len(runner.commands_of("child.execute")) == 1


async def test_it_answers_a_replay_after_the_child_finished(runner):
    await runner.open("root-1")
    first = await runner.start()
    await runner.finish(first["runId"], output="ok")
    again = await runner.start()
    assert again["runId"] == first["runId"]
    assert again["done"] is True and again["output"] == "ok"


@pytest.fixture
async def forking(runner_token, make_client):
    return await make_client(runner_token, extensions=[FORKING_EXTENSION])


async def test_it_refuses_a_reused_request_id_with_different_input(forking):
    runner = forking
    await runner.open("root-1")
    await runner.start()
    changes = [
        {"message": "do another thing"},
        {"profile": "reviewer"},
        {"systemPrompt": "extra"},
        {"options": {"maxTokens": 10}},
        {"contextMode": "fork"},
        {"cwd": "sub"},
    ]
    cases = []
    for change in changes:
        params = runner.child_params()
        params["request"].update(change)
        cases.append((params, "requestId"))
    await assert_all_refused(runner, "child.start", cases, -32013)
    assert await _runs() == 2


async def test_it_scopes_request_ids_to_the_parent(runner):
    await runner.open("root-1")
    await runner.open("root-2")
    a = await runner.start("root-1")
    b = await runner.start("root-2")
    assert a["runId"] != b["runId"]


async def test_it_answers_a_replay_even_when_the_caps_are_full(runner, settings):
    settings.DELEGATION_MAX_CONCURRENT = 2
    await runner.open("root-1")
    first = await runner.start(request_id="a")
    await runner.start(request_id="b")
    assert (await runner.error("child.start", runner.child_params(request_id="c")))[
        "code"
    ] == -32011
    assert (await runner.start(request_id="a"))["runId"] == first["runId"]


# --- admission caps -----------------------------------------------------------------------------


async def test_it_admits_at_most_max_concurrent_running_children(runner):
    await runner.open("root-1")
    children = [await runner.start(request_id=f"r{i}") for i in range(8)]
    error = await _refused(runner, runner.child_params(request_id="r8"), -32011)
    assert "admission" in error["message"]
    # Once one finishes, there is room again.
    await runner.finish(children[0]["runId"])
    assert (await runner.start(request_id="r8"))["status"] == "running"


async def test_it_follows_the_max_concurrent_setting(runner, settings):
    settings.DELEGATION_MAX_CONCURRENT = 3
    await runner.open("root-1")
    for i in range(3):
        await runner.start(request_id=f"r{i}")
    await _refused(runner, runner.child_params(request_id="r3"), -32011)


async def test_it_refuses_the_65th_child_of_a_parent(runner, settings):
    settings.DELEGATION_MAX_CONCURRENT = 1000
    await runner.open("root-1")
    for i in range(64):
        child = await runner.start(request_id=f"r{i}")
        if i % 2:
            await runner.finish(child["runId"])  # finished children still count
    await _refused(runner, runner.child_params(request_id="r64"), -32011)
    assert await _runs() == 65


async def test_it_counts_concurrency_per_parent(runner, settings):
    settings.DELEGATION_MAX_CONCURRENT = 1
    await runner.open("root-1")
    await runner.open("root-2")
    await runner.start("root-1")
    assert (await runner.start("root-2"))["parentRunId"] == "root-2"


# --- resume -------------------------------------------------------------------------------------


async def _finished_child(runner, **kw):
    child = await runner.start(**kw)
    await runner.finish(child["runId"], output="first")
    return child


async def test_it_resumes_an_earlier_child_in_a_new_run_of_the_same_session(runner):
    await runner.open("root-1")
    first = await _finished_child(runner)
    resumed = await runner.start(
        request_id="req-2", resume=first["conversationId"], message="continue"
    )
    assert resumed["conversationId"] == first["conversationId"]
    assert resumed["runId"] != first["runId"]
    assert resumed["depth"] == first["depth"] == 1
    assert resumed["status"] == "running" and resumed["output"] == ""
    execute = await runner.wait_command("child.execute", request={**resumed_request(first)})
    assert execute["params"]["identity"]["runId"] == resumed["runId"]
    sessions = await adb(Session.objects.filter(conversation_id=first["conversationId"]).count)()
    assert sessions == 1
    runs = await adb(Run.objects.filter(session__conversation_id=first["conversationId"]).count)()
    assert runs == 2


def resumed_request(first):
    return {
        "requestId": "req-2",
        "profile": "worker",
        "message": "continue",
        "resume": first["conversationId"],
    }


async def test_it_needs_a_child_run_id_once_a_child_has_several_runs(runner):
    await runner.open("root-1")
    first = await _finished_child(runner)
    second = await runner.start(request_id="req-2", resume=first["conversationId"])
    await runner.emit(second["runId"], ["second run"])
    error = await runner.error("child.read", runner.on_child(first))
    assert error["code"] == -32602 and "childRunId" in error["message"]
    old = await runner.read(first, childRunId=first["runId"])
    new = await runner.read(first, childRunId=second["runId"])
    assert (old["runId"], old["output"]) == (first["runId"], "first")
    assert (new["runId"], [e["text"] for e in new["events"]]) == (second["runId"], ["second run"])
    unknown = await runner.error("child.read", runner.on_child(first, childRunId="r-unknown"))
    assert unknown["code"] == -32003


async def test_it_refuses_to_resume_a_top_level_conversation(runner):
    await runner.open("root-1")
    await runner.open("other", conversation_id="conv-other")
    await runner.finish("other")
    await _refused(runner, runner.child_params(resume="conv-other"), -32003)


async def test_it_refuses_to_resume_an_unknown_conversation(runner):
    await runner.open("root-1")
    await _refused(runner, runner.child_params(resume="c-never-existed"), -32003)


async def test_it_refuses_to_resume_with_another_profile(runner):
    await runner.open("root-1")
    first = await _finished_child(runner)
    params = runner.child_params(
        request_id="req-2", profile="reviewer", resume=first["conversationId"]
    )
    await _refused(runner, params, -32003)


async def test_it_refuses_to_resume_a_child_of_another_parent_session(runner):
    await runner.open("root-1")
    await runner.open("root-2")
    first = await _finished_child(runner)
    params = runner.child_params(
        run_id="root-2", request_id="req-2", resume=first["conversationId"]
    )
    await _refused(runner, params, -32003)


async def test_it_refuses_to_resume_a_child_of_another_extension(runner_token, make_client):
    client = await make_client(
        runner_token,
        extensions=[
            DEFAULT_EXTENSION,
            {"extensionId": "ext2", "generation": 1, "presets": [{"name": "worker"}]},
        ],
    )
    await client.open("root-1")
    first = await _finished_child(client)
    params = client.child_params(request_id="req-2", resume=first["conversationId"])
    params["extensionId"] = "ext2"
    await _refused(client, params, -32003)


async def test_it_refuses_to_resume_another_runners_child(runner, make_client):
    await runner.open("root-1")
    first = await _finished_child(runner)
    other = await make_client(await create_runner_async("runner-b"))
    await other.open("root-b")
    params = other.child_params(run_id="root-b", request_id="x", resume=first["conversationId"])
    await _refused(other, params, -32003)


async def test_it_refuses_to_resume_a_child_that_is_still_running(runner):
    await runner.open("root-1")
    first = await runner.start()
    params = runner.child_params(request_id="req-2", resume=first["conversationId"])
    # Ambiguity (see findings): the SPEC is silent; one live run per session, refused as a cap.
    await _refused(runner, params, -32011)


async def test_it_refuses_resume_with_fork(runner):
    await runner.open("root-1")
    first = await _finished_child(runner)
    params = runner.child_params(
        request_id="req-2", resume=first["conversationId"], contextMode="fork"
    )
    await _refused(runner, params, -32602, "fork")


# --- fork ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, stored", [("fork", "fork"), ("fresh", "fresh"), ("", "fresh"), (None, "fresh")]
)
async def test_it_records_the_context_mode(forking, mode, stored):
    runner = forking
    await runner.open("root-1")
    kw = {} if mode is None else {"contextMode": mode}
    child = await runner.start(**kw)
    run = await adb(Run.objects.get)(run_id=child["runId"])
    assert run.context_mode == stored
    execute = await runner.wait_command("child.execute")
    if mode is not None:
        assert execute["params"]["request"]["contextMode"] == mode
    else:
        assert "contextMode" not in execute["params"]["request"]


async def test_it_starts_a_fork_as_a_new_session(forking):
    runner = forking
    await runner.open("root-1")
    fork = await runner.start(contextMode="fork")
    assert fork["depth"] == 1
    assert fork["conversationId"] != "conv-root-1"


# --- cwd confinement -------------------------------------------------------------------------


CONFINED = [
    ("pkg", "/srv/ws/pkg"),
    ("pkg/sub/../lib", "/srv/ws/pkg/lib"),
    (".", "/srv/ws"),
    ("/srv/ws", "/srv/ws"),
    ("/srv/ws/a/b", "/srv/ws/a/b"),
]
ESCAPING = ["..", "../etc", "/etc", "/srv/wsx", "/srv/ws/../other", "pkg/../../..", "/", "../wsx/y"]


async def test_it_confines_cwd_to_the_workspace(runner_token, make_client):
    client = await make_client(runner_token, workspace="/srv/ws")
    await client.open("root-1")
    for n, (cwd, confined) in enumerate(CONFINED):
        child = await client.start(request_id=f"c{n}", cwd=cwd)
        await client.finish(child["runId"])
        run = await adb(Run.objects.get)(run_id=child["runId"])
        assert run.cwd == confined, cwd


async def test_it_refuses_a_cwd_outside_the_workspace(runner_token, make_client):
    client = await make_client(runner_token, workspace="/srv/ws")
    await client.open("root-1")
    cases = [
        (client.child_params(request_id=f"c{n}", cwd=cwd), "cwd") for n, cwd in enumerate(ESCAPING)
    ]
    await assert_all_refused(client, "child.start", cases, -32602)


async def test_it_accepts_any_cwd_when_no_workspace_is_reported(runner):
    await runner.open("root-1")
    child = await runner.start(cwd="/anywhere/at/all")
    assert (await adb(Run.objects.get)(run_id=child["runId"])).cwd == "/anywhere/at/all"


# --- options narrowing ----------------------------------------------------------------------

NARROW_EXT = {
    "extensionId": "ext",
    "generation": 1,
    "presets": [
        {"name": "worker"},
        {
            "name": "tight",
            "options": {
                "maxTokens": 1000,
                "weakModelMaxTokens": 500,
                "thinkingBudgetTokens": 100,
                "maxTurns": 5,
                "allowedTools": ["read", "grep"],
                "allowedCommands": ["ls"],
            },
        },
        {"name": "locked", "options": {"noTools": True, "noExtensions": True, "noSkills": True}},
    ],
}


@pytest.fixture
async def narrow(runner_token, make_client):
    return await make_client(runner_token, extensions=[NARROW_EXT])


WIDENING = [
    ({"maxTokens": 1001}, "maxTokens"),
    ({"weakModelMaxTokens": 501}, "weakModelMaxTokens"),
    ({"thinkingBudgetTokens": 101}, "thinkingBudgetTokens"),
    ({"maxTurns": 6}, "maxTurns"),
    ({"allowedTools": ["read", "write"]}, "allowedTools"),
    ({"allowedTools": ["bash"]}, "allowedTools"),
    ({"allowedCommands": ["rm"]}, "allowedCommands"),
    ({"allowedCommands": ["ls", "rm"]}, "allowedCommands"),
]
NARROWING = [
    {"maxTokens": 1000},
    {"maxTokens": 1},
    {"maxTurns": 5, "thinkingBudgetTokens": 0},
    {"allowedTools": ["read"]},
    {"allowedTools": []},
    {"allowedCommands": []},
    {"noTools": True},
    {},
]


async def test_it_refuses_options_that_widen_the_parents(narrow):
    await narrow.open("root-1", profile="tight", extensionId="ext")
    cases = [(narrow.child_params(options=options), field) for options, field in WIDENING]
    await assert_all_refused(narrow, "child.start", cases, -32602)


async def test_it_accepts_options_that_narrow_the_parents(narrow):
    await narrow.open("root-1", profile="tight", extensionId="ext")
    for n, options in enumerate(NARROWING):
        child = await narrow.start(request_id=f"n{n}", options=options)
        await narrow.finish(child["runId"])
        run = await adb(Run.objects.get)(run_id=child["runId"])
        for key, value in options.items():
            assert run.options[key] == value, options
        # Omitted members inherit the parent's.
        assert run.options.get("maxTurns") == options.get("maxTurns", 5), options
        assert run.options.get("maxTokens") == options.get("maxTokens", 1000), options


async def test_it_refuses_to_switch_off_a_parents_restriction(narrow):
    await narrow.open("root-1", profile="locked", extensionId="ext")
    cases = [
        (narrow.child_params(options={flag: False}), flag)
        for flag in ("noTools", "noExtensions", "noSkills")
    ]
    await assert_all_refused(narrow, "child.start", cases, -32602)


async def test_it_narrows_through_every_level_of_the_tree(narrow):
    await narrow.open("root-1", profile="tight", extensionId="ext")
    child = await narrow.start(options={"maxTokens": 300, "allowedTools": ["read"]})
    # The grandchild inherits the child's narrowed options, not the root's.
    params = narrow.child_params(run_id=child["runId"], request_id="g", options={"maxTokens": 301})
    await _refused(narrow, params, -32602, "maxTokens")
    params = narrow.child_params(
        run_id=child["runId"], request_id="g", options={"allowedTools": ["grep"]}
    )
    await _refused(narrow, params, -32602, "allowedTools")
    grandchild = await narrow.start(child["runId"], request_id="g", options={"maxTokens": 300})
    run = await adb(Run.objects.get)(run_id=grandchild["runId"])
    assert run.options["maxTokens"] == 300 and run.options["allowedTools"] == ["read"]


async def test_it_lets_a_child_of_an_unrestricted_parent_choose_freely(runner):
    await runner.open("root-1")
    child = await runner.start(options={"maxTokens": 10**9, "allowedTools": ["anything"]})
    run = await adb(Run.objects.get)(run_id=child["runId"])
    assert run.options["maxTokens"] == 10**9


async def test_it_refuses_to_resume_a_child_of_another_runner_host(runner):
    """SPEC §4: resume only "an earlier child of the same parent chain (same parent session,
    extension, runner host, profile)"; a new host instance of the runner is another host.

    A new host instance also ends the old one's runs (README), so the parent keeps its
    authority here through a lease, which outlives the run that took it."""
    await runner.open("root-1")
    first = await _finished_child(runner, lease="L1")
    await runner.register(host="host-2")
    params = runner.start_params(request_id="req-2", lease="L1", resume=first["conversationId"])
    await _refused(runner, params, -32003, field="resume")


async def test_it_resumes_on_the_same_host_after_it_registers_again(runner):
    await runner.open("root-1")
    first = await _finished_child(runner, lease="L1")
    await runner.register(host="host-1")
    resumed = await runner.start(request_id="req-2", lease="L1", resume=first["conversationId"])
    assert resumed["conversationId"] == first["conversationId"]


# --- what a requestId replay compares -------------------------------------------------------
# The fingerprint of a child.start covers the request, extensionId, toolCallId and leaseId
# (README, "Idempotency of child.start"): a replay that differs only in the tool call it is
# bound to, or in the lease that owns it, asks for a different child and is refused.


async def test_it_refuses_a_request_id_replay_from_another_tool_call(runner):
    await runner.open("root-1")
    child = await runner.start(tool_call="call-1")
    again = await runner.start(tool_call="call-1")
    assert again["runId"] == child["runId"]
    error = await _refused(runner, runner.start_params(tool_call="call-2"), -32013, "requestId")
    assert "different input" in error["message"]
    await _refused(runner, runner.start_params(), -32013, "requestId")


async def test_it_refuses_a_request_id_replay_under_another_lease(runner):
    await runner.open("root-1")
    leased = await runner.start(lease="L1")
    assert (await runner.start(lease="L1"))["runId"] == leased["runId"]
    await _refused(runner, runner.start_params(lease="L2"), -32013, "requestId")
    await _refused(runner, runner.start_params(), -32013, "requestId")
    # The other way round: first without a lease, then the same requestId under one.
    await runner.start(request_id="plain")
    await _refused(runner, runner.start_params(request_id="plain", lease="L1"), -32013)
