"""An emulated network link for DDP's gradient all-reduce: a link you can dial (pure).

On loopback the all-reduce is fast and compute is noisy, so communication effects (overlap, the
exposed tail, bucket plans) drown in the noise of a shared machine. With a `Link`, every bucket's
all-reduce still runs for real over gloo (the gradients are the real reduced ones), and then its
completion is held until a link of the given latency and bandwidth would have carried it, transfers
queued one behind the other in the order they finished, as one wire serializes them:

    start = max(the real all-reduce finished, the link is free);  done = start + wire_s(bytes)

so the link's time comes on top of loopback's own (`rank/link.py` holds it; the buckets probe's hook is
where). `wire_s` is the ring all-reduce's cost: 2(p - 1) hops of `latency_us`, and every rank sends
2(p - 1)/p of the bucket's bytes at `gbit_s` (the bus bandwidth of nccl-tests,
docs/performance-anchors.md, "Bus bandwidth").

    Experiment(probes=("buckets",), link=Link.named("1GbE"))     # or Link(latency_us=100, gbit_s=2)

Read by the train task (with the buckets probe: its hook is where the hold happens), the bucket
sweep and the hook comparison (its hooks hold every call). Every table and figure of a run on a link says which (`describe`). Used by notebook 05.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import bad, is_number

MAX_LATENCY_US = 1e6     # a second a hop: far beyond any lesson, under any collective timeout
GBIT_RANGE = (1e-3, 1e4)   # 1 Mb/s .. 10 Tb/s


@dataclass(frozen=True)
class Link:
    name: str = "custom"
    latency_us: float = 50.0     # one hop's latency, microseconds
    gbit_s: float = 10.0         # what one rank sends per second, gigabits (10^9 bits)

    def check(self, exp=None) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > 40:
            bad("link.name", f"a short label of 1-40 characters (got {self.name!r})")
        if not is_number(self.latency_us) or not 0 <= self.latency_us <= MAX_LATENCY_US:
            bad("link.latency_us", f"must be microseconds in [0, {MAX_LATENCY_US:g}] (got {self.latency_us!r})")
        lo, hi = GBIT_RANGE
        if not is_number(self.gbit_s) or not lo <= self.gbit_s <= hi:
            bad("link.gbit_s", f"must be gigabits per second in [{lo:g}, {hi:g}] (got {self.gbit_s!r})")
        if exp is not None:
            _check_with(self, exp)

    def wire_s(self, n_bytes: int, world_size: int, calls: int = 1) -> float:
        """Seconds ring all-reduces of `n_bytes` in all, in `calls` calls, spend on this link with
        `world_size` ranks (each call pays the hops' latency)."""
        if world_size < 2 or calls == 0:
            return 0.0
        hops = 2 * (world_size - 1)
        return calls * hops * self.latency_us * 1e-6 + hops / world_size * n_bytes * 8 / (self.gbit_s * 1e9)

    def alpha_beta(self, world_size: int) -> tuple[float, float]:
        """The link's all-reduce cost as alpha (s) + n x beta (s per byte), to add to a fitted model's."""
        hops = 2 * (world_size - 1)
        return hops * self.latency_us * 1e-6, hops / world_size * 8 / (self.gbit_s * 1e9)

    def describe(self) -> str:
        return f"emulated link {self.name} ({self.latency_us:g} us a hop, {self.gbit_s:g} Gb/s) on top of loopback"

    @staticmethod
    def named(name: str) -> "Link":
        """A preset: one of `LINKS`."""
        if name not in LINKS:
            bad("link", f"must be one of {', '.join(LINKS)} or Link(latency_us, gbit_s) (got {name!r})")
        return LINKS[name]

    @staticmethod
    def from_dict(d) -> "Link | None":
        if d is None or isinstance(d, Link):
            return d
        if isinstance(d, str):
            return Link.named(d)
        if not isinstance(d, dict) or set(d) - {"name", "latency_us", "gbit_s"}:
            bad("link", f"must be Link(name, latency_us, gbit_s), a preset name or None (got {d!r})")
        return Link(**d)


LINKS = {"10GbE": Link("10GbE", latency_us=30.0, gbit_s=10.0),
         "1GbE": Link("1GbE", latency_us=50.0, gbit_s=1.0),
         "slow": Link("slow", latency_us=500.0, gbit_s=0.5)}


def describe(exp) -> str:
    """Which link a run's all-reduces went over, for a table's caption or a figure's title."""
    link = getattr(exp, "link", None)
    return link.describe() if link is not None else f"loopback ({exp.backend if exp.backend != 'auto' else 'gloo'}), no emulated link"


def _check_with(link: Link, exp) -> None:
    if exp.world_size < 2:
        bad("link", "needs world_size >= 2: one rank sends nothing")
    if exp.backend == "nccl" or exp.device == "cuda":
        bad("link", "is emulated for gloo all-reduces of CPU tensors: use backend='gloo' (or 'auto' on a machine "
                    "without GPUs) and device='cpu'")
    if exp.task.kind == "train":
        if exp.sync != "ddp" or exp.sharding == "fsdp2":
            bad("link", "holds DDP's bucket all-reduces: it needs sync='ddp' and sharding 'none' or 'zero1'")
        if "buckets" not in exp.probes:
            bad("link", "is held in the buckets probe's communication hook: add 'buckets' to probes")
    elif exp.task.kind not in ("bucket-sweep", "compression"):
        bad("link", f"only the train task, the bucket sweep and the hook comparison put DDP's all-reduces on a "
                    f"link (task is {exp.task.kind!r})")
