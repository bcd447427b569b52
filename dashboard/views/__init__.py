"""The operator dashboard's pages and actions.

Pages render what the database holds at request time; the browser then subscribes to
``/ws/live/`` (see ``dashboard.live``) and applies changes as they commit. Reads go through
``delegation.selectors``. Cancel and release are plain form posts here; the run page's steer
box posts to the REST API (``/api/runs/{runId}/steer``), the one JSON action surface. Every
action goes through the engine's operator services (``do_cancel_run``, ``do_steer_run``,
``release_lease``), which check the role and write the audit entry, so a cancel from here is
the same cancel as one from the admin, the REST API or a runner. A refused action answers 403
with the service's message (and the refusal is audited by the service). A signed-in user
without a role is refused before anything is looked up, so the answer is the same whether
the run or lease exists.

One module per page or job: ``base`` (role gate, page context, refusals), ``auth``,
``trees`` (overview and a tree), ``runs`` (a run's page, cancel) and ``run_forms`` (its
budget, relaunch and compare forms), ``fork_pause`` (fork from here, pause, resume), ``launch``, ``leases``, ``audit`` (runners and the audit
log), ``alerts`` (webhooks), ``approvals`` (the inbox), ``retention``.
"""
