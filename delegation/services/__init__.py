"""Writes, one module per domain (Zulip's ``zerver/actions`` layout): callers import from the
domain module, e.g. ``from delegation.services.run_actions import do_steer_run``.

Every service runs in one transaction and takes typed arguments (model rows, pydantic
objects), never raw JSON-RPC params: ``delegation.runner_socket.methods`` decodes those for the runner socket.
A refusal raises ``RpcError`` before anything is written, with one deliberate exception: a
depth refusal commits its ``delegation-refused`` event, then raises.
"""
