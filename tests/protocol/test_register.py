"""SPEC §4 Profile rules and §5 runner.register: generations, fencing, preset replacement."""

import pytest

from delegation.models import ExtensionPreset, Run, Runner
from tests.support.rpc import DEFAULT_EXTENSION, adb
from tests.support.state import assert_all_refused, state

pytestmark = pytest.mark.django_db(transaction=True)


def _ext(presets=None, extension_id="ext", generation=1, **extra):
    ext = {"extensionId": extension_id, "generation": generation, "presets": presets or []}
    ext.update(extra)
    return ext


async def _presets():
    return await adb(
        lambda: sorted(
            ExtensionPreset.objects.values_list(
                "extension_id", "generation", "name", "system_prompt"
            )
        )
    )()


async def test_it_answers_register_with_the_runner_id_and_a_new_generation(
    runner_token, make_client
):
    client = await make_client(runner_token, register=False)
    first = await client.register()
    assert first == {"runnerId": "runner-a", "connectionGeneration": 1}
    assert await _presets() == [
        ("ext", 1, "reviewer", ""),
        ("ext", 1, "worker", "You work."),
    ]


async def test_it_bumps_the_generation_on_every_register(runner_token, make_client):
    a = await make_client(runner_token, register=False)
    assert (await a.register())["connectionGeneration"] == 1
    assert (await a.register())["connectionGeneration"] == 2
    b = await make_client(runner_token, register=False)
    assert (await b.register())["connectionGeneration"] == 3
    runner = await adb(Runner.objects.get)(name="runner-a")
    assert runner.connection_generation == 3


async def test_it_allows_a_second_register_on_the_current_connection_replacing_presets(runner):
    await runner.open("root-1")
    again = await runner.register(extensions=[_ext([{"name": "solo"}], generation=2)])
    assert again["connectionGeneration"] == 2
    assert await _presets() == [("ext", 2, "solo", "")]
    # The old preset and the old generation are gone ...
    stale = await runner.error("child.start", runner.child_params(profile="worker"))
    assert stale["code"] == -32012
    old_gen = await runner.error("child.start", runner.child_params(profile="solo"))
    assert old_gen["code"] == -32012
    # ... and the new ones work on the same, still current, connection.
    params = runner.child_params(profile="solo")
    params["generation"] = 2
    child = await runner.ok("child.start", params)
    assert child["profile"] == "solo"


async def test_it_fences_an_older_connection_with_32002_and_close_4409(runner_token, make_client):
    a = await make_client(runner_token)
    await a.open("root-a")
    b = await make_client(runner_token)
    # The older connection is closed with 4409 once the newer one registers.
    assert await a.closed_with(timeout=5) == 4409
    before = await state()
    # What it sends before it hears the close reaches the server (the test client keeps its
    # side open), and is refused with -32002, changing nothing.
    rpc_id = await a.send("run.open", {"conversationId": "c-late", "runId": "late"})
    answer = await a.reply_to(rpc_id, timeout=5)
    assert answer["error"]["code"] == -32002, answer
    assert await state() == before
    assert not await adb(Run.objects.filter(run_id="late").exists)()
    # The newer connection is unaffected.
    assert (await b.open("root-b"))["runId"] == "root-b"


FENCED_CALLS = [
    ("run.open", lambda a, child: {"conversationId": "c2", "runId": "r2"}),
    ("run.event", lambda a, child: {"runId": "root-a", "from": 1, "events": [{"kind": "text"}]}),
    ("child.start", lambda a, child: a.child_params("root-a", "req-2")),
    ("child.read", lambda a, child: a.on_child(child, "root-a")),
    ("child.cancel", lambda a, child: a.on_child(child, "root-a")),
    ("child.steer", lambda a, child: a.on_child(child, "root-a", message="m", requestId="s")),
    ("run.finish", lambda a, child: {"runId": "root-a"}),
    ("tool.end", lambda a, child: {"runId": "root-a", "toolCallId": "t"}),
    (
        "child.lease.release",
        lambda a, child: {"leaseId": "L", "extensionId": "ext", "generation": 1},
    ),
]


@pytest.mark.parametrize("method, make_params", FENCED_CALLS, ids=[m for m, _ in FENCED_CALLS])
async def test_it_refuses_a_frame_of_a_connection_fenced_by_another_process(
    runner_token, make_client, method, make_params, monkeypatch
):
    """A frame in flight on the old socket when a newer one registers: -32002, then 4409."""
    from delegation.runner_socket import fences, methods
    from delegation.services import runners

    # The frame's own check, not the process's twice-a-second one, which would close the
    # socket first if its tick came between the registration and the frame.
    monkeypatch.setattr(fences, "CHECK_SECONDS", 3600)

    a = await make_client(runner_token)
    await a.open("root-a")
    child = await a.start("root-a")
    # Fence `a` in the database only, as a registration on another server process would,
    # so its close message never reaches it.
    runner = await adb(Runner.objects.get)(name="runner-a")
    conn = runners.Connection(runner_pk=runner.pk)
    await adb(methods.register)(
        conn, {"hostInstanceId": "elsewhere", "extensions": [DEFAULT_EXTENSION]}
    )
    before = await state()
    rpc_id = await a.send(method, make_params(a, child))
    answer = await a.reply_to(rpc_id)
    assert answer["error"]["code"] == -32002, answer
    assert await a.closed_with(timeout=5) == 4409
    assert await state() == before


BAD_REGISTERS = [
    ({"extensions": []}, "hostInstanceId"),
    ({"hostInstanceId": "", "extensions": []}, "hostInstanceId"),
    ({"hostInstanceId": "a/b", "extensions": []}, "hostInstanceId"),
    ({"hostInstanceId": "..", "extensions": []}, "hostInstanceId"),
    ({"hostInstanceId": "h", "extensions": [_ext(generation=0)]}, "generation"),
    ({"hostInstanceId": "h", "extensions": [_ext(generation=-1)]}, "generation"),
    ({"hostInstanceId": "h", "extensions": [_ext(generation="1")]}, "generation"),
    ({"hostInstanceId": "h", "extensions": [_ext(generation=True)]}, "generation"),
    ({"hostInstanceId": "h", "extensions": [_ext(apiKey="sk")]}, "apiKey"),
    ({"hostInstanceId": "h", "extensions": [_ext(), _ext()]}, "extensionId"),
    ({"hostInstanceId": "h", "extensions": {}}, "extensions"),
    ({"hostInstanceId": "h", "extensions": [], "token": "x"}, "token"),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": ""}])]}, "name"),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": "  "}])]}, "name"),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": "a/b"}])]}, "name"),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": "a\\b"}])]}, "name"),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": "a\u0000b"}])]}, "name"),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": "n" * 129}])]}, "name"),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": "\u00e9" * 65}])]}, "name"),
    (
        {
            "hostInstanceId": "h",
            "extensions": [_ext([{"name": "w", "systemPromptPath": "/etc/p"}])],
        },
        "systemPromptPath",
    ),
    (
        {
            "hostInstanceId": "h",
            "extensions": [_ext([{"name": "w", "systemPrompt": "p" * (256 * 1024 + 1)}])],
        },
        "systemPrompt",
    ),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": "w", "options": None}])]}, "options"),
    (
        {
            "hostInstanceId": "h",
            "extensions": [_ext([{"name": "w", "options": {"maxTokens": None}}])],
        },
        "maxTokens",
    ),
    (
        {
            "hostInstanceId": "h",
            "extensions": [_ext([{"name": "w", "options": {"baseUrl": "http://x"}}])],
        },
        "baseUrl",
    ),
    (
        {"hostInstanceId": "h", "extensions": [_ext([{"name": "w", "options": {"maxTokens": 0}}])]},
        "maxTokens",
    ),
    ({"hostInstanceId": "h", "extensions": [_ext([{"name": "w"}, {"name": "w"}])]}, "w"),
    (
        {"hostInstanceId": "h", "extensions": [_ext([{"name": f"p{i}"} for i in range(33)])]},
        "32",
    ),
    ({"hostInstanceId": "h", "extensions": [_ext([{"Name": "w"}])]}, "Name"),
]


async def test_it_refuses_a_bad_register_with_32602_and_keeps_everything(runner):
    await assert_all_refused(runner, "runner.register", BAD_REGISTERS, -32602)
    # The connection is still current, with its old generation and presets.
    assert (await runner.register())["connectionGeneration"] == 2
    await runner.open("root-1")
    assert (await runner.start())["profile"] == "worker"


async def test_it_accepts_32_presets_and_boundary_names(runner_token, make_client):
    presets = [{"name": f"p{i}"} for i in range(31)] + [
        {"name": "n" * 128, "systemPrompt": "p" * 256 * 1024}
    ]
    client = await make_client(runner_token, register=False)
    await client.register(extensions=[_ext(presets)])
    assert len(await _presets()) == 32
    await client.open("root-1")
    child = await client.start(profile="n" * 128)
    assert child["profile"] == "n" * 128
    execute = await client.wait_command("child.execute")
    assert execute["params"]["preset"]["systemPrompt"] == "p" * 256 * 1024


async def test_it_refuses_a_fenced_register(runner_token, make_client):
    a = await make_client(runner_token)
    await make_client(runner_token)
    assert await a.closed_with(timeout=5) == 4409
    before = await state()
    rpc_id = await a.send("runner.register", {"hostInstanceId": "h", "extensions": []})
    # Refused, never taking the runner back.
    answer = await a.reply_to(rpc_id, timeout=5)
    assert answer["error"]["code"] == -32002, answer
    assert await state() == before
