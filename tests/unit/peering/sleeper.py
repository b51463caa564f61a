"""A stand-in agent process for tests/unit/peering/test_localagents.py: it starts a child that
would outlive it (like a virtual kubelet) and waits."""

import subprocess
import sys
import time

if __name__ == "__main__":
    child = subprocess.Popen(["sleep", "300"])
    print(child.pid, flush=True)
    time.sleep(300)
    sys.exit(0)
