"""gloo's framing per all-reduce call, by message size: the bytes a rank writes beyond the ring's share.

    python bench/gloo_framing.py [--world-size 2] [--repeats 5] [--max-mib 16]

One `AllReduceSweep` launch (real torchrun ranks on gloo, CPU) over powers of two from 4 B to
`--max-mib` MiB plus a few sizes between the large ones; each rank counts the bytes it wrote during
every call (`/proc/self/io` wchar, `rank/probes/bytes.py`). Prints, per size, the ring's share
2(D-1)/D x N, the framing (written minus that share: median, min and max over ranks and repeats) and
the rule `predict.compression.gloo_framing` (1 MiB pieces, a 144-byte header each) with whether every
call matched it exactly.
The compression task's byte check (`tables.compression.bytes_table`) reads the framing of the sizes its
hooks send from its own launch, interpolated between the sizes it measured (`framing_at`); this
script shows why one constant per call is not enough: gloo splits a large message into more pieces,
each with its own header.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import ddplab
from ddplab.predict.comm import ring_bytes_per_rank
from ddplab.predict.compression import gloo_framing
from ddplab.recipes.communication import allreduce_sweep
from ddplab.units import MIB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-mib", type=int, default=16)
    args = ap.parse_args()
    top = args.max_mib * MIB
    between = tuple(n for n in (3 * MIB, 6 * MIB, 12 * MIB, 14 * MIB, 15 * MIB) if n < top)
    exp = allreduce_sweep(args.world_size, min_bytes=4, max_bytes=top, repeats=args.repeats, extra_bytes=between,
                          name=f"gloo-framing-w{args.world_size}")
    with tempfile.TemporaryDirectory() as tmp:
        run = ddplab.run(exp, f"{tmp}/run", progress=False)
        print(f"gloo's framing per all-reduce call on {args.world_size} ranks (torch {run.ranks[0].envelope.torch_version}, "
              f"{args.repeats} repeats per size, every rank): bytes written minus the ring's 2(D-1)/D x N")
        print(f"{'bytes':>10} {'ring_share':>12} {'framing_median':>15} {'framing_min':>12} {'framing_max':>12} "
              f"{'rule':>6} {'every call':>10}")
        misses = 0
        for per_rank in zip(*[r.result.sizes for r in run.ranks]):
            n = per_rank[0].bytes
            ring = ring_bytes_per_rank(n, args.world_size)
            framing = [b - ring for c in per_rank for b in c.write_bytes]
            small = n < 2 * args.world_size * 4   # pieces left empty: outside the rule
            rule = None if small else gloo_framing(n, args.world_size)
            same = "-" if small else ("matches" if all(f == rule for f in framing) else "DIFFERS")
            misses += same == "DIFFERS"
            print(f"{n:>10} {ring:>12.0f} {statistics.median(framing):>15.0f} {min(framing):>12.0f} "
                  f"{max(framing):>12.0f} {'' if small else rule:>6} {same:>10}")
        print(f"the rule matched every call of every size from {2 * args.world_size * 4} B on" if not misses else
              f"the rule missed {misses} size(s)")


if __name__ == "__main__":
    main()
