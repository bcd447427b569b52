"""The inbox and the run page offer only what the approval's door can run (SPEC §11, issue
35): the real claude-agent-acp adapter, offline, asks to ``touch`` a file; its card offers
allow and deny but no "edit, then allow" (an ACP agent takes an option id only), while a
runner's approval that can run an edit still offers one. Allowing runs the input as asked."""

from __future__ import annotations

import asyncio
import threading

import pytest

from delegation.runner import model_stub
from delegation.runner.acp import AcpEngine, AcpPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.support.agents import claude_cli
from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level"),
    needs_chromium,
    pytest.mark.timeout(180),
]


def _script(target):
    def script(request):
        if request.tool_results:
            return model_stub.Text("Done.")
        command = {"command": f"touch {target}", "description": "Create the marker"}
        return model_stub.ToolCall("Bash", command, text="Creating it.")

    return script


def _drive_acp_agent(server, token, workspace, env, shared: dict, stop: threading.Event):
    """The acp engine in its own thread and loop: start a child, wait for it to end."""

    async def drive():
        # The stub model's address, for the sandbox's egress proxy (SPEC §13).
        model = env["ANTHROPIC_BASE_URL"]
        preset = AcpPreset(
            "claude",
            [claude_cli.acp_bin()],
            env=env,
            ask_canopy=True,
            allow_hosts=tuple(claude_cli.allow_model(model)),
        )
        engine = AcpEngine([preset], str(workspace))
        host = RunnerHost(server.ws_url, token, engine, extension_id="claude", client_options=FAST)
        ext, gen, c = host.extension_id, host.generation, host.client
        async with host:
            await c.open_run("acp-conv", "acp-root")
            request = {"requestId": "r1", "profile": "claude", "message": "touch it"}
            child = await c.child_start("acp-root", ext, gen, request)
            shared["childRunId"] = child.run_id
            while not stop.is_set():
                result = await c.child_read("acp-root", ext, gen, child.child_id, after=10**9)
                if result.done:
                    shared["result"] = result
                    break
                await asyncio.sleep(0.1)
            await c.finish("acp-root", output="ok")

    try:
        asyncio.run(drive())
    except BaseException as exc:  # shown by the test's assertion
        shared["error"] = repr(exc)


def test_it_offers_no_edit_for_an_acp_approval_and_runs_it_as_asked(
    server, runner, browser, operator, tmp_path
):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    target = workspace / "ORIGINAL-asked.txt"
    _runner, token = tokens.create_runner("claude-acp")
    # A runner's approval whose door can run an edit (no canEdit: SPEC §11 as written).
    runner.open("editable-run")
    editable = runner.call(
        "approval.request",
        {
            "runId": "editable-run",
            "toolCallId": "t-1",
            "toolName": "Bash",
            "input": {"command": "ls"},
        },
    )
    shared: dict = {}
    stop = threading.Event()
    with model_stub.ModelStub(_script(target)) as stub:
        env = claude_cli.offline_env(stub.url, tmp_path / "home", IS_SANDBOX="1")
        thread = threading.Thread(
            target=_drive_acp_agent,
            args=(server, token, workspace, env, shared, stop),
            daemon=True,
        )
        thread.start()
        try:
            page = browser()
            sign_in(page, server.http_url, operator.username, PASSWORD)
            page.goto(f"{server.http_url}/approvals/")
            page.wait_for_selector("[data-role=approvals-count]:text-is('2')")
            acp = page.wait_for_selector(
                "#approvals [data-approval-id][data-live]:has-text('ORIGINAL-asked.txt')"
            )
            assert f"$ touch {target}" in acp.text_content()
            assert acp.query_selector("[data-action=allow]") is not None
            assert acp.query_selector("[data-action=deny]") is not None
            assert acp.query_selector("[data-action=edit]") is None
            assert acp.query_selector("[name=updatedInput]") is None
            assert "cannot run an edit" in acp.query_selector("[data-role=no-edit]").text_content()
            other = page.wait_for_selector(
                f"#approvals [data-approval-id='{editable['approvalId']}'][data-live]"
            )
            assert other.query_selector("[data-action=edit]") is not None
            assert other.query_selector("[data-role=no-edit]") is None

            # The run page's card for the same approval offers no edit either.
            run_page = browser()
            sign_in(run_page, server.http_url, operator.username, PASSWORD)
            run_page.goto(f"{server.http_url}/runs/{shared['childRunId']}/")
            card = run_page.wait_for_selector("#run-approvals [data-approval-id][data-live]")
            assert card.query_selector("[data-action=allow]") is not None
            assert card.query_selector("[data-action=edit]") is None

            # "e" (edit, then allow) on the focused ACP card does nothing: nothing to press.
            acp.focus()
            page.keyboard.press("e")
            assert acp.query_selector("[name=updatedInput]") is None
            assert not target.exists()
            acp.query_selector("[data-action=allow]").click()
            page.wait_for_selector("#approvals [data-role=outcome]:has-text('allow by operator:')")
            thread.join(120)
        finally:
            stop.set()
            thread.join(30)
    assert "error" not in shared, shared.get("error")
    assert shared["result"].status == "succeeded", shared["result"].error
    assert target.exists()
