from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from delegation.models import Event, Run, Runner
from delegation.runner_socket import methods
from delegation.services import runners, tokens

pytestmark = pytest.mark.django_db


def _run_with_events(name, finished_days_ago=None):
    runner, _ = tokens.create_runner(f"runner-{name}")
    conn = runners.Connection(runner_pk=runner.pk)
    _, generation, _ = methods.register(conn, {"hostInstanceId": "h", "extensions": []})
    conn = runners.Connection(runner_pk=runner.pk, generation=generation)
    methods.open_run(conn, {"conversationId": f"c-{name}", "runId": name})
    methods.append_event_frame(
        conn, {"runId": name, "from": 1, "events": [{"kind": "text", "text": "x"}] * 3}
    )
    if finished_days_ago is not None:
        methods.finish_run(conn, {"runId": name})
        Run.objects.filter(run_id=name).update(
            finished_at=timezone.now() - timedelta(days=finished_days_ago)
        )


def test_it_creates_lists_and_revokes_runner_tokens(capsys):
    call_command("runner_token", "create", "alpha")
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert tokens.authenticate_runner(token).name == "alpha"
    call_command("runner_token", "list")
    assert "alpha" in capsys.readouterr().out
    call_command("runner_token", "revoke", "alpha")
    assert tokens.authenticate_runner(token) is None
    assert Runner.objects.get(name="alpha").revoked_at is not None


def test_it_refuses_to_revoke_an_unknown_runner():
    with pytest.raises(CommandError, match="no active runner"):
        call_command("runner_token", "revoke", "nobody")


def test_it_refuses_a_runner_name_that_is_not_a_valid_id():
    with pytest.raises(CommandError, match="must not contain"):
        call_command("runner_token", "create", "a/b")


def test_it_purges_only_events_of_runs_finished_before_the_cutoff():
    _run_with_events("old", finished_days_ago=40)
    _run_with_events("recent", finished_days_ago=1)
    _run_with_events("live")
    call_command("purge_events", "--days", "30")
    assert not Event.objects.filter(run__run_id="old").exists()
    assert Event.objects.filter(run__run_id="recent").count() == 3
    assert Event.objects.filter(run__run_id="live").count() == 3


def test_it_refuses_to_purge_when_retention_is_off(settings):
    settings.EVENT_RETENTION_DAYS = 0
    with pytest.raises(CommandError, match="retention is off"):
        call_command("purge_events")
