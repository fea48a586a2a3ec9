"""What a rank's start costs in CPU-seconds, with and without `host.import_torch_frozen`.

    python bench/rank_startup.py [--rounds 7]

Every rank (and torchrun's agent) starts a fresh interpreter and imports torch; a DDP rank then
imports torch._dynamo too (DDP's constructor asks it for its optimize_ddp mode). This alternates, round
after round, two fresh interpreters doing exactly that: one imports torch and torch._dynamo plainly, the
other as `rank/worker.py` does, `ddplab.host.import_torch_frozen("torch._dynamo")` (the cyclic collector
off during both imports, their objects then frozen out of later collections). It prints the
median CPU-seconds (user + system, from the child's rusage) of each, their ratio, and whether the
target is met: the frozen start costs at most 0.85x the plain one.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

PLAIN = "import torch\nimport torch._dynamo\n"
FROZEN = "from ddplab.host import import_torch_frozen\nimport_torch_frozen('torch._dynamo')\n"
TARGET = 0.85


def cpu_seconds(code: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cpu_seconds("import torch")   # warm the page cache once, for neither side's benefit
    plain, frozen = [], []
    for i in range(args.rounds):
        order = [(PLAIN, plain), (FROZEN, frozen)]
        for code, into in (order if i % 2 == 0 else order[::-1]):
            into.append(cpu_seconds(code))
    p, f = statistics.median(plain), statistics.median(frozen)
    print(f"plain import torch + torch._dynamo:   median {p:.2f} CPU-s over {args.rounds} rounds "
          f"(range {min(plain):.2f}-{max(plain):.2f})")
    print(f"import_torch_frozen('torch._dynamo'): median {f:.2f} CPU-s (range {min(frozen):.2f}-{max(frozen):.2f})")
    ratio = f / p
    print(f"ratio frozen / plain: {ratio:.2f} (target: at most {TARGET}) -> "
          f"{'target met' if ratio <= TARGET else 'target NOT met'}")


if __name__ == "__main__":
    main()
