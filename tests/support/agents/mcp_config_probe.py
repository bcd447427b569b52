"""A command-engine agent that reports what it was given for Canopy's MCP server.

argv[1] is the ``{mcpConfig}`` path. It prints, as ``lines`` events, the file's mode, its
server entry with the token replaced by whether it matched ``MCP_PROBE_EXPECT`` (so the token
itself never reaches an event), and whether the token is on its argv or in its environment;
then waits for one line on stdin (so a test can look at the file while the child runs).
"""

import json
import os
import stat
import sys

path = sys.argv[1]
expected = os.environ.get("MCP_PROBE_EXPECT", "")
with open(path, encoding="utf-8") as fh:
    config = json.load(fh)
server = config["mcpServers"]["canopy"]
auth = server["headers"].pop("Authorization")
# What a careless agent might do (a debug mode): print its own configuration.
print(f"debug: my MCP header is {auth}", file=sys.stderr, flush=True)
print(f"debug: my MCP header is {auth}", flush=True)
report = {
    "path": path,
    "mode": oct(stat.S_IMODE(os.stat(path).st_mode)),
    "dirMode": oct(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)),
    "server": server,
    "keys": sorted(config),
    "tokenMatches": auth == f"Bearer {expected}",
    "tokenOnArgv": any(expected in a for a in sys.argv),
    "tokenInEnv": any(expected in v for k, v in os.environ.items() if k != "MCP_PROBE_EXPECT"),
    "settingsEnv": os.environ.get("SETTINGS_PATH", ""),
}
print(json.dumps({"kind": "probe", "input": report}), flush=True)
sys.stdin.readline()
print(json.dumps({"kind": "result", "text": "probed"}), flush=True)
