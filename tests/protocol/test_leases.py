"""SPEC §6 leases: created by the first child.start, never extended, expiry (sweep and at
once), release with drain, −32016, tombstones, idempotent release, owner checks."""

import asyncio
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from delegation.models import AuditEntry, Lease, Run
from delegation.services import sweep
from tests.support.rpc import DEFAULT_EXTENSION, adb, create_runner_async
from tests.support.state import assert_all_refused, event_kinds, state

pytestmark = pytest.mark.django_db(transaction=True)


def release_params(lease="L1", extension="ext", generation=1):
    return {"leaseId": lease, "extensionId": extension, "generation": generation}


async def _lease(lease_id="L1", runner="runner-a") -> Lease:
    return await adb(Lease.objects.get)(lease_id=lease_id, runner__name=runner)


async def _status(run_id):
    return (await adb(Run.objects.get)(run_id=run_id)).status


async def _leased_children(runner, n=2, lease="L1"):
    await runner.open("root-1")
    return [await runner.start(request_id=f"bg-{i}", lease=lease) for i in range(n)]


# --- creation ----------------------------------------------------------------------------------


async def test_it_creates_a_lease_with_the_first_child_start(runner):
    before = timezone.now()
    await runner.open("root-1")
    child = await runner.start(lease="L1")
    lease = await _lease()
    assert (lease.state, lease.extension_id, lease.generation) == ("active", "ext", 1)
    ttl = (lease.expires_at - before).total_seconds()
    assert 3595 <= ttl <= 3605
    parent = await adb(
        lambda: Lease.objects.select_related("parent_run").get(pk=lease.pk).parent_run.run_id
    )()
    assert parent == "root-1"
    execute = await runner.wait_command("child.execute")
    assert execute["params"]["leaseId"] == "L1"
    assert execute["params"]["request"]["leaseId"] == "L1"
    assert execute["params"]["identity"]["runId"] == child["runId"]


async def test_it_uses_the_lease_ttl_setting(runner, settings):
    settings.LEASE_TTL_SECONDS = 120
    await runner.open("root-1")
    before = timezone.now()
    await runner.start(lease="L1")
    ttl = ((await _lease()).expires_at - before).total_seconds()
    assert 115 <= ttl <= 125


async def test_it_never_extends_a_lease_by_use(runner):
    children = await _leased_children(runner, 1)
    expires = (await _lease()).expires_at
    await asyncio.sleep(0.05)
    await runner.start(request_id="bg-more", lease="L1")
    await runner.ok("child.read", runner.on_child(children[0], leaseId="L1"))
    await runner.ok(
        "child.steer", runner.on_child(children[0], leaseId="L1", message="m", requestId="s")
    )
    assert (await _lease()).expires_at == expires
    assert await adb(Lease.objects.count)() == 1


async def test_it_leaves_no_lease_behind_a_refused_first_child_start(runner):
    await runner.open("root-1")
    params = runner.start_params(lease="L1", profile="ghost")
    assert (await runner.error("child.start", params))["code"] == -32012
    assert await adb(Lease.objects.count)() == 0


async def test_it_refuses_a_lease_of_another_generation_on_child_start_with_32012(runner):
    await _leased_children(runner, 1)
    await runner.register(
        extensions=[DEFAULT_EXTENSION, {"extensionId": "ext9", "generation": 1, "presets": []}]
    )
    params = runner.start_params(request_id="x", lease="L1")
    params["generation"] = 2
    before = await state()
    assert (await runner.error("child.start", params))["code"] == -32012
    assert await state() == before


async def test_it_refuses_a_lease_held_by_another_extension(runner_token, make_client):
    client = await make_client(
        runner_token,
        extensions=[
            DEFAULT_EXTENSION,
            {"extensionId": "ext2", "generation": 1, "presets": [{"name": "worker"}]},
        ],
    )
    children = await _leased_children(client, 1)
    before = await state()
    params = client.start_params(request_id="x", lease="L1")
    params["extensionId"] = "ext2"
    assert (await client.error("child.start", params))["code"] == -32003
    read = client.on_child(children[0], leaseId="L1", extensionId="ext2")
    assert (await client.error("child.read", read))["code"] == -32003
    assert await state() == before


# --- background children: what a lease allows -----------------------------------------------


async def test_it_keeps_leased_children_alive_after_the_parent_finishes(runner):
    children = await _leased_children(runner, 2)
    await runner.finish("root-1")
    await runner.quiet(0.2)
    for child in children:
        assert runner.commands_of("run.cancel", runId=child["runId"]) == []
        assert await _status(child["runId"]) == "running"
        assert await event_kinds(child["runId"]) == []


async def test_it_lets_a_lease_manage_children_after_the_parent_finished(runner):
    children = await _leased_children(runner, 2)
    await runner.emit(children[0]["runId"], ["progress"])
    await runner.finish("root-1")
    # With runId (finished) and leaseId, and with leaseId alone.
    for run_id in ("root-1", None):
        read = await runner.ok("child.read", runner.on_child(children[0], run_id, leaseId="L1"))
        assert [e["text"] for e in read["events"]] == ["progress"]
    steer = await runner.ok(
        "child.steer", runner.on_child(children[0], None, leaseId="L1", message="m", requestId="s")
    )
    assert steer == {"outcome": "injected"}
    more = await runner.start(run_id="root-1", request_id="bg-late", lease="L1")
    assert more["parentRunId"] == "root-1" and more["depth"] == 1
    cancel = await runner.ok("child.cancel", runner.on_child(children[1], None, leaseId="L1"))
    assert cancel["runId"] == children[1]["runId"]
    await runner.wait_command("run.cancel", runId=children[1]["runId"])


async def test_it_refuses_a_foreground_child_through_a_lease(runner):
    await runner.open("root-1")
    fg = await runner.start(request_id="fg")
    await runner.start(request_id="bg", lease="L1")
    error = await runner.error("child.read", runner.on_child(fg, None, leaseId="L1"))
    assert error["code"] == -32003


async def test_it_refuses_an_unknown_lease_on_read_with_32003(runner):
    children = await _leased_children(runner, 1)
    error = await runner.error("child.read", runner.on_child(children[0], None, leaseId="L-nope"))
    assert error["code"] == -32003


# --- expiry -------------------------------------------------------------------------------------


async def test_it_stops_an_expired_lease_from_authorising_at_once(runner):
    children = await _leased_children(runner, 1)
    await runner.finish("root-1")
    # Expired a second ago, rather than waiting out a short TTL.
    await adb(Lease.objects.update)(expires_at=timezone.now() - timedelta(seconds=1))
    # No sweep has run: expiry still refuses.
    before = await state()
    for method, params in (
        ("child.read", runner.on_child(children[0], None, leaseId="L1")),
        ("child.read", runner.on_child(children[0], "root-1", leaseId="L1")),
        (
            "child.steer",
            runner.on_child(children[0], None, leaseId="L1", message="m", requestId="s"),
        ),
        ("child.cancel", runner.on_child(children[0], None, leaseId="L1")),
        ("child.start", runner.start_params(request_id="late", lease="L1")),
    ):
        error = await runner.error(method, params)
        assert error["code"] == -32015, (method, error)
    assert await state() == before


async def test_it_expires_a_lease_in_the_sweep_and_cancels_its_children(runner):
    children = await _leased_children(runner, 2)
    fg = await runner.start(request_id="fg")
    report = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=3601))
    assert report.expired_leases == ["L1"]
    lease = await _lease()
    assert lease.state == "expired"
    assert await event_kinds("root-1") == ["lease-released"]
    for child in children:
        assert await event_kinds(child["runId"]) == ["cancel-requested"]
        await runner.wait_command("run.cancel", runId=child["runId"])
    await runner.wait_command("lease.revoked", leaseId="L1")
    # A foreground child is not under the lease.
    assert await event_kinds(fg["runId"]) == []
    # Refused from now on, and the sweep does not expire it twice.
    error = await runner.error("child.read", runner.on_child(children[0], None, leaseId="L1"))
    assert error["code"] == -32015
    again = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=7200))
    assert again.expired_leases == []
    assert await event_kinds("root-1") == ["lease-released"]


async def test_it_does_not_expire_a_lease_before_its_ttl(runner):
    await _leased_children(runner, 1)
    report = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=3500))
    assert report.expired_leases == []
    assert (await _lease()).state == "active"


async def test_it_expires_with_a_short_ttl_setting(runner, settings):
    settings.LEASE_TTL_SECONDS = 60
    children = await _leased_children(runner, 1)
    # The sweep is asked about a later moment instead of the test waiting for it.
    early = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=30))
    assert early.expired_leases == []
    report = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=61))
    assert report.expired_leases == ["L1"]
    await runner.wait_command("run.cancel", runId=children[0]["runId"])


# --- release -----------------------------------------------------------------------------------


async def _release_and_drain(runner, children, params=None):
    """Release, then let the runner stop the children while the release waits."""
    rpc_id = await runner.send("child.lease.release", params or release_params())
    for child in children:
        await runner.wait_command("run.cancel", runId=child["runId"])
        await runner.finish(child["runId"], cancelled=True)
    return await runner.reply_to(rpc_id)


async def test_it_releases_a_lease_after_its_children_finish(runner):
    children = await _leased_children(runner, 2)
    answer = await _release_and_drain(runner, children)
    assert answer["result"] == {"done": True}
    lease = await _lease()
    assert lease.state == "released"
    assert await event_kinds("root-1") == ["lease-released"]
    for child in children:
        assert await event_kinds(child["runId"]) == ["cancel-requested"]
        assert await _status(child["runId"]) == "cancelled"
    audit = await adb(
        lambda: list(
            AuditEntry.objects.filter(action="release").values_list("target_id", flat=True)
        )
    )()
    assert audit == ["L1"]


async def test_it_releases_a_lease_whose_children_are_already_done(runner):
    children = await _leased_children(runner, 1)
    await runner.finish(children[0]["runId"])
    assert await runner.ok("child.lease.release", release_params()) == {"done": True}
    assert (await _lease()).state == "released"
    assert await event_kinds(children[0]["runId"]) == []


async def test_it_answers_32016_when_children_do_not_finish_in_time(runner, settings):
    settings.LEASE_RELEASE_WAIT_SECONDS = 0.3
    children = await _leased_children(runner, 1)
    error = await runner.error("child.lease.release", release_params())
    assert error["code"] == -32016
    assert error["message"] == "cleanup is not yet confirmed; retry release"
    # The lease is revoked all the same; the cancel is on its way.
    assert (await _lease()).state == "released"
    await runner.wait_command("run.cancel", runId=children[0]["runId"])
    # Still not finished: a retry is still unconfirmed.
    assert (await runner.error("child.lease.release", release_params()))["code"] == -32016
    await runner.finish(children[0]["runId"], cancelled=True)
    assert await runner.ok("child.lease.release", release_params()) == {"done": True}
    assert await event_kinds("root-1") == ["lease-released"]
    assert await event_kinds(children[0]["runId"]) == ["cancel-requested"]


def test_it_waits_five_seconds_by_default():
    # The default as the settings read it with nothing in the environment; the waiting itself
    # is tested below with a wait far longer than the test, so no timer races the machine.
    env = {k: v for k, v in os.environ.items() if k != "LEASE_RELEASE_WAIT_SECONDS"}
    code = "from django.conf import settings; print(settings.LEASE_RELEASE_WAIT_SECONDS)"
    shown = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        env={**env, "DJANGO_SETTINGS_MODULE": "canopy.settings"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert float(shown) == 5.0


async def test_it_waits_for_the_children_and_answers_when_they_finish(runner, settings):
    settings.LEASE_RELEASE_WAIT_SECONDS = 600
    children = await _leased_children(runner, 1)
    rpc_id = await runner.send("child.lease.release", release_params())
    await runner.wait_command("run.cancel", runId=children[0]["runId"])
    # Still waiting (no answer of any kind) while the child runs; in order: once this read
    # is answered, an answer to the release sent before it would have been seen.
    sentinel = await runner.call("no.such.method")
    assert sentinel["error"]["code"] == -32601
    assert rpc_id not in runner.stash
    # ... and the child finishing completes the release, long before the wait is over.
    await runner.finish(children[0]["runId"], cancelled=True)
    answer = await runner.reply_to(rpc_id, timeout=30)
    assert answer["result"] == {"done": True}


async def test_it_treats_a_repeated_release_as_success(runner):
    children = await _leased_children(runner, 1)
    await _release_and_drain(runner, children)
    before = await state()
    assert await runner.ok("child.lease.release", release_params()) == {"done": True}
    after = await state()
    assert {k: v for k, v in after["counts"].items() if k != "AuditEntry"} == {
        k: v for k, v in before["counts"].items() if k != "AuditEntry"
    }
    assert await event_kinds("root-1") == ["lease-released"]


async def test_it_refuses_a_released_lease_with_32015(runner):
    children = await _leased_children(runner, 1)
    await _release_and_drain(runner, children)
    before = await state()
    start = await runner.error("child.start", runner.start_params(request_id="late", lease="L1"))
    assert start["code"] == -32015
    read = await runner.error("child.read", runner.on_child(children[0], None, leaseId="L1"))
    assert read["code"] == -32015
    assert await state() == before


async def test_it_leaves_a_tombstone_for_an_unknown_lease(runner):
    await runner.open("root-1")
    assert await runner.ok("child.lease.release", release_params("ghost")) == {"done": True}
    lease = await _lease("ghost")
    assert lease.state not in ("active",)
    before = await state()
    error = await runner.error("child.start", runner.start_params(lease="ghost"))
    assert error["code"] == -32015
    assert await state() == before
    assert await adb(Run.objects.count)() == 1
    # Releasing the tombstone again still succeeds.
    assert await runner.ok("child.lease.release", release_params("ghost")) == {"done": True}


@pytest.mark.parametrize(
    "params", [release_params(extension="other"), release_params(generation=2)]
)
async def test_it_refuses_release_by_another_extension_or_generation(runner, params):
    children = await _leased_children(runner, 1)
    before = await state()
    error = await runner.error("child.lease.release", params)
    assert error["code"] == -32003
    assert await state() == before
    assert (await _lease()).state == "active"
    assert await _status(children[0]["runId"]) == "running"
    assert runner.commands_of("run.cancel") == []


async def test_it_scopes_leases_per_runner(runner, make_client):
    children = await _leased_children(runner, 1)
    other = await make_client(await create_runner_async("runner-b"))
    await other.open("root-b")
    # Runner B's "L1" is its own (unknown: a tombstone), and A's lease is untouched.
    assert await other.ok("child.lease.release", release_params()) == {"done": True}
    assert (await _lease("L1", "runner-a")).state == "active"
    assert await _status(children[0]["runId"]) == "running"
    assert (await runner.read(children[0], None, leaseId="L1"))["runId"] == children[0]["runId"]
    # And B can never use A's lease for A's children.
    error = await other.error("child.read", other.on_child(children[0], "root-b", leaseId="L1"))
    assert error["code"] in (-32003, -32015)


async def test_it_lets_two_runners_hold_the_same_lease_id(runner, make_client):
    await _leased_children(runner, 1)
    other = await make_client(await create_runner_async("runner-b"))
    await other.open("root-b")
    child_b = await other.start("root-b", lease="L1")
    assert child_b["runnerId"] == "runner-b"
    assert await adb(Lease.objects.filter(lease_id="L1", state="active").count)() == 2


MALFORMED_RELEASES = [
    ({"extensionId": "ext", "generation": 1}, "leaseId"),
    ({"leaseId": "L1", "generation": 1}, "extensionId"),
    ({"leaseId": "L1", "extensionId": "ext"}, "generation"),
    (release_params(generation=0), "generation"),
    (release_params(generation="1"), "generation"),
    (release_params(lease=""), "leaseId"),
    (release_params(lease="a/b"), "leaseId"),
    (release_params(lease=None), "leaseId"),
    ({**release_params(), "force": True}, "force"),
]


async def test_it_refuses_a_malformed_release(runner):
    await _leased_children(runner, 1)
    await assert_all_refused(runner, "child.lease.release", MALFORMED_RELEASES, -32602)
    assert (await _lease()).state == "active"


async def test_it_answers_other_calls_while_a_release_waits(runner, settings):
    settings.LEASE_RELEASE_WAIT_SECONDS = 2
    children = await _leased_children(runner, 1)
    rpc_id = await runner.send("child.lease.release", release_params())
    # The socket keeps serving frames during the wait.
    read = await runner.ok("child.read", runner.on_child(children[0], "root-1"))
    assert read["runId"] == children[0]["runId"]
    await runner.finish(children[0]["runId"], cancelled=True)
    answer = await runner.reply_to(rpc_id)
    assert answer == {"jsonrpc": "2.0", "id": rpc_id, "result": {"done": True}}
