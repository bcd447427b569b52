#!/usr/bin/env python3
"""A tiny agent for the command-engine tests.

It reports its pid, level and working directory, prints a plain line and a structured event,
then echoes every stdin line (a steer) back as an event until told "finish". Modes (argv[1]):
``steerable`` (default), ``fail`` (exits 3 after a stderr line), ``stubborn`` (ignores SIGTERM,
saying "ignored SIGTERM", so only SIGKILL ends it).
"""

import json
import os
import signal
import sys


def say(**event):
    print(json.dumps(event), flush=True)


mode = sys.argv[1] if len(sys.argv) > 1 else "steerable"
if mode == "stubborn":
    # Says so, so a test sees SIGTERM arrive and fail to end it without timing the process.
    signal.signal(signal.SIGTERM, lambda *_: say(kind="text", text="ignored SIGTERM"))
say(
    kind="text",
    text=(
        f"pid={os.getpid()} depth={os.environ.get('PANDO_DELEGATION_DEPTH')} "
        f"cwd={os.getcwd()} token={os.environ.get('CANOPY_RUNNER_TOKEN', '-')}"
    ),
)
print("a plain line from the agent", flush=True)
say(kind="tool-use", toolName="grep", toolCallId="t1", input={"pattern": "TODO"})
say(kind="tool-result", toolName="grep", toolCallId="t1", success=True, toolOutput={"hits": 2})
if mode == "fail":
    print("something broke", file=sys.stderr, flush=True)
    sys.exit(3)
for line in sys.stdin:
    message = line.strip()
    say(kind="text", text=f"steered: {message}")
    if message == "finish":
        say(kind="result", text="all done")
        sys.exit(0)
