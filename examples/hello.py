"""A tiny CPU job: greets, shows the environment suanli gives every rank, and ticks for about 3 seconds."""

import os
import socket
import time

print(f"{os.environ.get('GREETING', 'hello')} from suanli on {socket.gethostname()}", flush=True)
for key in sorted(k for k in os.environ if k.startswith("SUANLI_") or k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
    print(f"  {key}={os.environ[key]}", flush=True)
for step in range(1, 4):
    time.sleep(1)
    print(f"step {step}/3", flush=True)
print("done", flush=True)
