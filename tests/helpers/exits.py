"""A command for the CLI helper's parity tests: ``python -m tests.helpers.exits WHAT [CODE]``
says where it runs, then exits with CODE, raises, is interrupted or sleeps, as WHAT says."""

import os
import sys
import time

what = sys.argv[1]
argv0 = os.path.basename(sys.argv[0])
print(f"cwd={os.getcwd()} extra={os.environ.get('EXTRA')} argv0={argv0} main={__name__}")
print("to stderr", file=sys.stderr)
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "raise":
    raise ValueError("boom")
if what == "interrupt":
    raise KeyboardInterrupt
if what == "sleep":
    print("sleeping", flush=True)
    time.sleep(30)
