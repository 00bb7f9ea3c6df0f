"""One measurement per fresh process: the GPU check scripts run themselves as children
(``SCRIPT --child ARGS``), and each child prints its result as one line ``RESULT {json}``.

:func:`spawn` runs one such child under a timeout and returns that object, or
``{"error": ..., "args": ...}`` with the end of its output when it timed out, failed or printed
no result, so that a crash or a hang costs one measurement and never the run.
"""

import json
import os
import subprocess
import sys
import time


def spawn(script, args, timeout, env=None, tail=12):
    """``script --child *args`` in a fresh Python; its RESULT object with ``process_s`` added."""
    t0 = time.perf_counter()
    e = dict(os.environ, PYTHONWARNINGS="ignore")
    e.update(env or {})
    argv = [str(x) for x in args]
    try:
        r = subprocess.run([sys.executable, str(script), "--child", *argv], capture_output=True, text=True,
                           timeout=timeout, env=e)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "args": argv}
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        end = (r.stdout + r.stderr).strip().splitlines()[-tail:]
        return {"error": f"rc={r.returncode}: " + " | ".join(end)[-1500:], "args": argv}
    res = json.loads(lines[-1][len("RESULT "):])
    res["process_s"] = time.perf_counter() - t0
    return res
