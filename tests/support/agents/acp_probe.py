"""A minimal ACP agent on the standard library alone, for presets whose agent runs as another
account (``"user"``), which cannot read the project's virtual environment.

Its one turn answers with what it is: ``{"uid": ..., "pid": ..., "environToken": ...}``, where
``environToken`` says whether a parent process's environment (the runner's) was readable.
"""

from __future__ import annotations

import json
import os
import sys


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def parent_environ_readable() -> bool:
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            return b"CANOPY_RUNNER_TOKEN" in f.read()
    except OSError:
        return False


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        method, rpc_id = request.get("method"), request.get("id")
        if rpc_id is None:
            continue  # a notification (session/cancel): nothing to stop
        if method == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}
        elif method == "session/new":
            result = {"sessionId": "probe"}
        elif method == "session/prompt":
            me = {"uid": os.getuid(), "pid": os.getpid(), "environToken": parent_environ_readable()}
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": "probe",
                        "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": json.dumps(me)},
                        },
                    },
                }
            )
            result = {"stopReason": "end_turn"}
        else:
            send({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": -32601, "message": method}})
            continue
        send({"jsonrpc": "2.0", "id": rpc_id, "result": result})


if __name__ == "__main__":
    main()
