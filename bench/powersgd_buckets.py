"""PowerSGD with two or more buckets on gloo (torch 2.13): does it run? Notebook 10 cites this; it is not
in the test suite because the failing case costs a timeout.

    python bench/powersgd_buckets.py [--timeout 40]

Three 2-rank torchrun launches of the same small network under `powerSGD_hook`, each rank's whole tree
killed at the timeout:
- one bucket (bucket_cap_mb=25): expected to run;
- several buckets (bucket_cap_mb=0.25), gloo's default 2 worker threads, and again on a gloo group of 8
  threads: the hook waits on its own all-reduces inside future callbacks, which gloo runs on its worker
  threads; they hang there, or race and issue the buckets' collectives in a different order on each
  rank (gloo's size-mismatch error). Both were seen, from one launch to the next: expected not to run.
Prints each launch's outcome, and says whether each matched its expectation.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from ddplab.launch.torchrun import kill_tree

SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    dist.init_process_group("gloo")
    group = None
    if os.environ["THREADS"] != "default":
        opts = dist.ProcessGroupGloo._Options()
        opts._threads = int(os.environ["THREADS"])
        opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        group = dist.new_group(backend="gloo", pg_options=opts)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(512, 128), nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128), nn.Linear(128, 512))
    ddp = DDP(net, bucket_cap_mb=float(os.environ["CAP"]), process_group=group)
    ddp.register_comm_hook(psgd.PowerSGDState(process_group=group, start_powerSGD_iter=2), psgd.powerSGD_hook)
    for step in range(5):
        ddp(torch.randint(0, 512, (8, 16))).logsumexp(-1).mean().backward()
    if dist.get_rank() == 0:
        print("buckets:", ddp._get_ddp_logging_data().get("num_buckets_reduced", "?"), "- ran 5 steps")
    dist.destroy_process_group()
""")

CASES = [("one bucket", "25", "default", ("runs",)),
         ("several buckets, 2 gloo threads", "0.25", "default", ("hangs", "fails")),
         ("several buckets, 8 gloo threads", "0.25", "8", ("hangs", "fails"))]


def launch(path: str, cap: str, threads: str, timeout: float) -> tuple[str, str]:
    env = {**os.environ, "CAP": cap, "THREADS": threads}
    with tempfile.TemporaryFile("w+") as log:
        p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                              path], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p, Path(path))   # torchrun, every rank (each in its own session), anything running the script
            return "hangs", f"no result within {timeout:g} s"
        finally:
            kill_tree(p, Path(path))
        log.seek(0)
        out = log.read()
    if p.returncode == 0:
        return "runs", next((line for line in out.splitlines() if "ran 5 steps" in line), "")
    lines = [line.strip() for line in out.splitlines()]
    why = next((x for x in lines if "mismatch" in x), None) or next((x for x in lines if x.startswith("[rank") and "Error:" in x),
                                                                   "failed: " + " | ".join(lines[-3:]))
    return "fails", why[:300]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=40.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "powersgd.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        ok = True
        for name, cap, threads, expected in CASES:
            seen, detail = launch(path, cap, threads, args.timeout)
            ok &= seen in expected
            print(f"{name}: {seen} (expected: {' or '.join(expected)}) {detail}")
    print("as expected" if ok else "NOT as expected: torch or gloo may have changed; update notebook 10's note")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
