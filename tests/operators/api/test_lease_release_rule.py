"""A REST release follows SPEC §6's rule for child.lease.release, as the runner socket does: it
waits for the lease's children to finish before answering, and audits its reason."""

import threading
import time

import pytest
from django.db import connection

from delegation.models import AuditEntry, Lease
from delegation.runner_socket import methods

# Transactional: the release must commit before the runner's confirmation can land.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(as_):
    return as_("operator", "token")


def _confirm_cancel_later(world, run_id: str) -> threading.Thread:
    """The runner confirms the cancel shortly after the release went out, as a runner does."""

    def confirm():
        try:
            while not Lease.objects.filter(pk=world.lease_pk, state="released").exists():
                time.sleep(0.02)
            time.sleep(0.2)
            methods.finish_run(world.conn, {"runId": run_id, "cancelled": True})
        finally:
            connection.close()

    thread = threading.Thread(target=confirm)
    thread.start()
    return thread


def test_it_waits_for_the_leases_children_before_answering_a_rest_release(api, world):
    confirmer = _confirm_cancel_later(world, world.leased["runId"])
    response = api.post(f"/api/leases/{world.lease_pk}/release")
    confirmer.join(10)
    assert response.status_code == 200, response.content
    # Answered at once (the old REST behaviour) it would still list the child as pending.
    assert response.json() == {"done": True, "pending": [], "state": "released"}


def test_it_audits_the_reason_of_a_rest_release(api, world):
    confirmer = _confirm_cancel_later(world, world.leased["runId"])
    response = api.post(f"/api/leases/{world.lease_pk}/release", {"reason": "tidy up"})
    confirmer.join(10)
    assert response.status_code == 200, response.content
    entry = AuditEntry.objects.get(action="release", target_type="lease")
    assert (entry.via, entry.reason, entry.outcome) == ("api", "tidy up", "released")
