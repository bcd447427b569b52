"""A command-engine agent for bench.engines: ``burst N`` prints N events as fast as it can;
``paced N MS`` prints N lines MS apart, each stamped with ``time.monotonic_ns()`` when printed
(system-wide on Linux, so another process on the machine can subtract it)."""

import json
import sys
import time

mode, count = sys.argv[1], int(sys.argv[2])
if mode == "burst":
    out = sys.stdout
    for i in range(count):
        out.write(json.dumps({"kind": "text-delta", "text": f"line {i} " + "x" * 40}) + "\n")
    out.flush()
else:
    pause = int(sys.argv[3]) / 1000
    for _ in range(count):
        print(f"t={time.monotonic_ns()}", flush=True)
        time.sleep(pause)
print(json.dumps({"kind": "result", "text": "done"}), flush=True)
