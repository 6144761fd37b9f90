"""Plan on a `cbbench calibrate` fit, serve the chosen configuration, bench it, and say
whether each measured SLO figure lands in the plan's interval (docs/planning.md, #46).

    python tests/benchmarks/studies/plan_validation.py FIT WORKLOAD RATE N OUT [SLO] [SPACE]

One replica by default (replicas=1-1: this machine has two cores for the server and the
load generator); a SPACE with more serves them with `cbbench serve --replicas N --router P`. The server binds 127.0.0.1 on an ephemeral port, the bench
is bounded by N requests and a 15-minute limit. Prints one line per SLO and writes
OUT/validation.json beside the plan and the bench run.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from cbbench.harness.planning.planner import Point
from cbbench.harness.planning.report import serve_flags

SPACE = "replicas=1-1;max_num_seqs=4,8,16;max_num_batched_tokens=512,2048"


def main(fit: str, wl: str, rate: str, n: str, out: str,
         slo: str = "ttft_p99=3s,tpot_p99=150ms", space: str = SPACE) -> int:  # fmt: skip
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/plan.txt", "w") as log:
        rc = subprocess.run(["cbbench", "plan", "--workload", wl, "--rate", rate, "--slo", slo,
                             "--hardware", fit, "--price", "0.1", "--space", space,
                             "--num-requests", n, "--out", f"{out}/plan"],
                            stdout=log, stderr=subprocess.STDOUT).returncode  # fmt: skip
    if rc:
        with open(f"{out}/plan.txt") as f:
            print(f.read().splitlines()[-1])
        return rc
    with open(f"{out}/plan/plan.json") as f:
        plan = json.load(f)
    ch = plan["chosen"]
    # the plan's own `cbbench serve` line (with --replicas N --router P past one replica)
    line = serve_flags(Point(**ch), plan["model"])
    flags = line.split()[2:]
    print("chosen:", line)
    srv = subprocess.Popen(["cbbench", "serve", *flags, "--port", "0"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        # read (and drained) by a thread: a silent server cannot hang us, a chatty one blocks
        # on no full pipe; "" at its end
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [*map(lines.put, srv.stdout), lines.put("")],
                         daemon=True).start()  # fmt: skip
        url, deadline = None, time.monotonic() + 600
        while url is None and (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if not line:
                break  # the server exited before it was ready
            if m := re.search(r"ready at (http://127\.0\.0\.1:\d+)", line):
                url = m.group(1)
        if url is None:
            print("the server did not start")
            return 1
        with open(f"{out}/bench.txt", "w") as log:
            subprocess.run(["cbbench", "bench", "--base-url", url, "--workload", wl, "--rate", rate,
                            "--num-requests", n, "--seed", "0", "--out", f"{out}/bench",
                            "--no-live"], stdout=log, stderr=subprocess.STDOUT, timeout=900)  # fmt: skip
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        try:
            srv.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
    with open(glob.glob(f"{out}/bench/**/run.json", recursive=True)[0]) as f:
        summary = json.load(f)["summary"]
    rows = []
    for name, pred in ch["predicted"].items():
        metric, stat = name.split("_")
        real = (summary.get(f"{'ttft' if metric == 'ttfo' else metric}_s") or {}).get(stat)
        lo, hi = ch["low"][name], ch["high"][name]
        inside = real is not None and lo <= real <= hi
        rows.append({"slo": name, "predicted": pred, "low": lo, "high": hi, "measured": real,
                     "inside": inside, "binding": name == ch["binding"]})  # fmt: skip
        print(f"{name}{' (binding)' if name == ch['binding'] else ''}: predicted {pred:.4g} s "
              f"[{lo:.4g}, {hi:.4g}], measured {real} s: {'in' if inside else 'OUT'}")  # fmt: skip
    with open(f"{out}/validation.json", "w") as f:
        json.dump({"chosen": ch, "rows": rows}, f, indent=1)
    return 0 if all(r["inside"] for r in rows) else 3


if __name__ == "__main__":
    if not 6 <= len(sys.argv) <= 8:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
