"""The runner socket (SPEC §5): the WebSocket a runner host (``delegation.runner``) keeps open
to the server, seen from the server's side.

- ``consumer``: the socket consumer (``RunnerSocketConsumer``): handshake, frame loop, answers
  and commands out.
- ``envelope``: the one check of a frame's JSON-RPC envelope, whatever the method.
- ``methods``: each method's params decoded and validated, then the typed service called.
- ``frame_groups``: every ``run.event`` frame's way in, a group commit across the process's
  sockets (a frame that cannot join a group is a group of one).
- ``database_calls``: service calls from the event loop (database thread, doorbells, retry).
- ``fences``: registered sockets re-checked against the record (revoked, rotated, taken over).
- ``keepalive``: one keep-alive for all the process's sockets (touch, outbox poll; issue 39).
- ``pressure``: back-pressure, a saturated process's busy answer to ``run.event`` (issue 39).
"""
