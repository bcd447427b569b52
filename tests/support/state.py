"""Stored-state helpers for conformance tests: a refused frame must change nothing."""

from __future__ import annotations

from tests.support.rpc import RpcClient, adb


def observable_state() -> dict:
    """Everything a later read could observe, to prove a refused frame changed nothing."""
    from delegation import models as m

    return {
        "counts": {
            model.__name__: model.objects.count()
            for model in (
                m.Runner,
                m.ExtensionPreset,
                m.Lease,
                m.Session,
                m.Run,
                m.Event,
                m.SteerReceipt,
                m.Command,
                m.AuditEntry,
            )
        },
        "runners": list(
            m.Runner.objects.order_by("pk").values_list(
                "name", "connection_generation", "host_instance_id", "workspace", "revoked_at"
            )
        ),
        "presets": sorted(
            (p.runner_id, p.extension_id, p.generation, p.name, repr(p.options), p.system_prompt)
            for p in m.ExtensionPreset.objects.all()
        ),
        "runs": list(
            m.Run.objects.order_by("pk").values_list(
                "run_id",
                "status",
                "done",
                "cancelled",
                "error",
                "output",
                "last_sequence",
                "emitted",
                "cancel_requested_at",
            )
        ),
        "leases": list(
            m.Lease.objects.order_by("pk").values_list("lease_id", "state", "expires_at")
        ),
        # Which commands exist; when the runner answers them is its business (the test
        # client answers asynchronously), so answered_at is left out.
        "commands": list(m.Command.objects.order_by("pk").values_list("pk", "method")),
    }


async def state() -> dict:
    return await adb(observable_state)()


def _short(value, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"


async def assert_all_refused(client: RpcClient, method: str, cases, code: int) -> None:
    """Each ``(params, field)`` case must be refused with ``code`` naming ``field`` (if not None)
    and leave the observable state unchanged. All cases run; every mismatch is reported."""
    problems = []
    for params, field in cases:
        before = await state()
        frame = await client.call(method, params)
        error = frame.get("error")
        if error is None or error.get("code") != code:
            problems.append(f"{_short(params)} -> {_short(frame, 400)} (wanted {code})")
        elif field is not None and field not in error.get("message", ""):
            problems.append(f"{_short(params)} -> message {error.get('message')!r} lacks {field!r}")
        elif await state() != before:
            problems.append(f"{_short(params)} -> refused but changed the stored state")
    assert not problems, "\n".join(problems)


async def assert_all_raw_refused(client: RpcClient, texts, code: int) -> None:
    """Raw frames that must each be answered with ``code`` (whatever id) and change nothing."""
    problems = []
    for text in texts:
        before = await state()
        await client.send_raw(text)
        frame = await client.next_response()
        error = frame.get("error")
        if error is None or error.get("code") != code:
            problems.append(f"{_short(text)} -> {_short(frame, 400)} (wanted {code})")
        elif await state() != before:
            problems.append(f"{_short(text)} -> refused but changed the stored state")
    assert not problems, "\n".join(problems)


async def event_kinds(run_id: str) -> list[str]:
    """The kinds of a run's stored events, in sequence order."""
    from delegation.models import Event

    return await adb(
        lambda: list(
            Event.objects.filter(run__run_id=run_id)
            .order_by("sequence")
            .values_list("kind", flat=True)
        )
    )()
