import os
import sys

# Before torch loads: OpenMP threads that spin after each parallel region steal the CPU
# from the event loop and the core's own worker pool; on a small machine that turned some
# engine steps from ~0.1 s into ~2 s. Passive waiting costs a little per step and removes
# those stalls. An explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import logging  # noqa: E402

from server.cli import main  # noqa: E402

code = main()
# Everything the server owns (listeners, the engine, its child processes, the responses
# store) is closed by now. What remains is the interpreter's own teardown, which with torch
# and its thread pools loaded took seconds after every clean stop: flush and leave.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
