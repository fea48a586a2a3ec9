"""What a DDP communication hook puts on the wire, and whether it pays (pure: numbers in, numbers out).

DDP hands each bucket of local gradients to a communication hook, which must average it across
ranks and may change what travels (torch.distributed.algorithms.ddp_comm_hooks). Per bucket:

- `allreduce`: the float32 bucket in one all-reduce, 4 bytes a parameter.
- `fp16`, `bf16`: cast to a 2-byte float, one all-reduce, 2 bytes a parameter; cast back after.
- `powersgd` (Vogels et al., 2019): for its first `start_iter` steps the plain all-reduce; after,
  three all-reduces: the tensors it leaves uncompressed (float32, in one flat tensor), then every
  compressed matrix's factor P (n x r), then its Q (m x r). torch's rule, per gradient tensor: view it
  as n = shape[0] rows by m = numel / n columns, r = min(n, m, rank); compress it when
  (n + m) r x min_compression_rate < n m. A 1-D tensor (a bias, a norm's scale) never passes.
- `noop`: no call at all; the local gradient is used as it is (the headroom of free communication).

The bucket holds only the parameters that require a gradient (DDP leaves frozen ones out of every
bucket), so `shapes` are theirs. A ring all-reduce of N bytes has each rank send 2(D - 1)/D N
(`comm.ring_bytes_per_rank`); gloo adds framing bytes per non-empty call, which grow with N (2 ranks,
torch 2.13: 576 B up to 4 MiB, 2,304 B at 15-16 MiB: `gloo_framing`, docs/gloo-framing.md), so the
compression task measures them in the same launch at every size its hooks send. The payload rule is
exact (the bytes each call carries); what a rank writes is exact given the framing at each call's size.

The step model (`step_ms`): with the whole gradient in one bucket, DDP launches the hook after the last
gradient and nothing overlaps, so a step is its work on one rank, with communication free (the hook
run on a one-rank group: compute plus compressing and decompressing) plus each call's all-reduce on
the wire (alpha-beta, fitted here) plus, on an emulated link, each call's time on that link.
Used by notebook 10 and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import MIB
from .comm import ring_bytes_per_rank

HOOKS = ("allreduce", "fp16", "bf16", "powersgd", "noop")
BYTES_PER_ELEMENT = {"allreduce": 4, "fp16": 2, "bf16": 2}
SIGNIFICANT_BITS = {"fp16": 11, "bf16": 8}   # with the implicit leading bit: unit roundoff 2^-bits


@dataclass(frozen=True)
class PowerSGD:
    """PowerSGD's settings that decide its payload (torch's `PowerSGDState` names)."""

    rank: int = 2                    # matrix_approximation_rank
    start_iter: int = 2              # start_powerSGD_iter: plain all-reduce before this step
    min_compression_rate: float = 2.0


def rounding_bound(hook: str, ranks: int) -> float:
    """The most a cast-and-sum hook's average may differ from the exact one, element by element, as a
    fraction of the mean of the ranks' |g|: (1 + u)^k - 1, about k u, with u = 2^-bits the format's unit
    roundoff. torch's hook casts each rank's value (one rounding), divides it by D in the format (exact
    when D is a power of two, one more rounding otherwise) and the all-reduce adds D values (D - 1
    roundings of the partial sum): k = D, or D + 1. Holds where every rank's share |g| / D is a normal
    number of the format (fp16: at least 2^-14); below that, rounding is coarser."""
    if hook not in SIGNIFICANT_BITS or ranks < 1:
        raise ValueError(f"hook, ranks: need one of {sorted(SIGNIFICANT_BITS)} and ranks >= 1, got {hook!r}, {ranks}")
    roundings = ranks + (0 if ranks & (ranks - 1) == 0 else 1)
    return (1 + 2.0 ** -SIGNIFICANT_BITS[hook]) ** roundings - 1


def matrix_view(shape) -> tuple[int, int]:
    """(n, m): the matrix PowerSGD sees a gradient of `shape` as, n = shape[0] rows. torch's hook fails
    on a 0-d gradient (it views it as shape[0] x -1), so the rule refuses one too."""
    shape = [int(s) for s in shape]
    if not shape:
        raise ValueError("shapes: torch's PowerSGD hook cannot view a 0-d gradient as a matrix")
    numel = 1
    for s in shape:
        numel *= s
    n = shape[0]
    return n, numel // n if n else 0


def compresses(shape, psgd: PowerSGD) -> bool:
    """Whether PowerSGD compresses a gradient of `shape` (torch's `_should_compress`)."""
    n, m = matrix_view(shape)
    r = min(n, m, psgd.rank)
    return (n + m) * r * psgd.min_compression_rate < n * m


def numel(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def hook_calls(hook: str, shapes, step: int = 0, psgd: PowerSGD = PowerSGD()) -> list[int]:
    """Bytes of every all-reduce the hook issues for one bucket of float32 gradients of `shapes`, at
    0-based step `step` (PowerSGD compresses from `psgd.start_iter` on)."""
    if hook not in HOOKS:
        raise ValueError(f"hook: one of {', '.join(HOOKS)} (got {hook!r})")
    elements = sum(numel(s) for s in shapes)
    if hook == "noop":
        return []
    if hook in BYTES_PER_ELEMENT:
        return [elements * BYTES_PER_ELEMENT[hook]]
    if step < psgd.start_iter:
        return [elements * 4]
    plain = p = q = 0
    for s in shapes:
        n, m = matrix_view(s)
        if compresses(s, psgd):
            r = min(n, m, psgd.rank)
            p, q = p + n * r, q + m * r
        else:
            plain += numel(s)
    return [4 * plain, 4 * p, 4 * q]


def payload_bytes(hook: str, shapes, step: int = 0, psgd: PowerSGD = PowerSGD()) -> int:
    """Bytes the hook all-reduces for one bucket: the sum over its calls."""
    return sum(hook_calls(hook, shapes, step, psgd))


def written_bytes(hook: str, shapes, world_size: int, framing_per_call, step: int = 0,
                  psgd: PowerSGD = PowerSGD()) -> float:
    """Bytes one rank writes for the bucket: each call's ring share plus gloo's framing for that call,
    `framing_per_call` bytes, or `framing_per_call(call_bytes)` where it is a function of the size. An
    empty call (PowerSGD's uncompressed tensors, when it compresses every one) writes nothing at all on
    torch 2.13's gloo (measured; it used to fail there, pytorch#58467)."""
    frame = framing_per_call if callable(framing_per_call) else (lambda _: framing_per_call)
    calls = hook_calls(hook, shapes, step, psgd)
    return sum(ring_bytes_per_rank(c, world_size) + frame(c) for c in calls if c)


GLOO_HEADER_BYTES = 144     # per piece of a message a rank sends (torch 2.13's gloo, measured)
GLOO_SEGMENT_BYTES = MIB    # the largest piece


def gloo_framing(n_bytes: int, world_size: int, element_bytes: int = 4) -> int:
    """gloo's framing bytes one rank writes for an all-reduce of `n_bytes` on `world_size` ranks, as
    measured on torch 2.13 (bench/gloo_framing.py): its ring cuts the message into S pieces of at most
    1 MiB, at least 2 per rank and a multiple of the ranks, and each rank sends 2(D - 1)/D x S of them,
    each behind a 144-byte header. For messages of at least 2D elements (smaller ones leave pieces
    empty, and send fewer)."""
    d = world_size
    if n_bytes < 2 * d * element_bytes:
        raise ValueError(f"n_bytes: the framing rule holds from 2 x world_size elements "
                         f"({2 * d * element_bytes} bytes) on (got {n_bytes})")
    pieces = -(-max(2 * d, -(-n_bytes // GLOO_SEGMENT_BYTES)) // d) * d
    return GLOO_HEADER_BYTES * 2 * (d - 1) * pieces // d


def compression_ratio(hook: str, shapes, step: int = 0, psgd: PowerSGD = PowerSGD()) -> float:
    """How many times fewer bytes than the float32 all-reduce (inf for noop)."""
    sent = payload_bytes(hook, shapes, step, psgd)
    return payload_bytes("allreduce", shapes) / sent if sent else float("inf")


def step_ms(local_ms: float, calls, call_s, link_s=None) -> float:
    """The step the model predicts: `local_ms` (the hook on a one-rank group) plus, for every call of
    `calls` (bytes), `call_s(bytes)` seconds on this machine's wire and `link_s(bytes)` on a link."""
    calls = [c for c in calls if c]   # an empty call sends nothing (`written_bytes`)
    wire = sum(call_s(c) for c in calls) + (sum(link_s(c) for c in calls) if link_s else 0.0)
    return local_ms + 1e3 * wire


def comm_ms(hook: str, shapes, world_size: int, busbw_bytes_per_s: float, latency_s: float, step: int = 10 ** 9,
            psgd: PowerSGD = PowerSGD()) -> float:
    """A link's time for the hook's all-reduces of one bucket (ms): per call, `latency_s` plus the ring's
    bytes at the bus bandwidth of nccl-tests (`busbw` = algbw x 2(D - 1)/D, so t = N 2(D - 1)/D / busbw)."""
    return 1e3 * sum(latency_s + ring_bytes_per_rank(c, world_size) / busbw_bytes_per_s
                     for c in hook_calls(hook, shapes, step, psgd) if c)


# bytes of memory traffic per parameter to compress and decompress, on a device whose memory bandwidth
# bounds both (an assumption, labelled as such where it is used): a cast reads 4 and writes 2, the cast
# back reads 2 and writes 4; PowerSGD reads each matrix for P = MQ and again for Q = M^T P, reads and
# writes it for the error feedback, and writes the decompressed P Q^T
TRAFFIC_BYTES_PER_PARAMETER = {"allreduce": 0, "fp16": 12, "bf16": 12, "powersgd": 24, "noop": 0}


def cluster_step_ms(hook: str, shapes, world_size: int, busbw_bytes_per_s: float, latency_s: float,
                    compute_ms: float, memory_bytes_per_s: float, psgd: PowerSGD = PowerSGD()) -> dict:
    """The step model on a machine that did not run here (a prediction): `compute_ms` (forward and
    backward, given), compression as memory traffic over `memory_bytes_per_s`
    (`TRAFFIC_BYTES_PER_PARAMETER`), and the calls at the link's bus bandwidth and latency, nothing
    overlapped (one bucket)."""
    params = sum(numel(s) for s in shapes)
    compress = 1e3 * TRAFFIC_BYTES_PER_PARAMETER[hook] * params / memory_bytes_per_s
    wire = comm_ms(hook, shapes, world_size, busbw_bytes_per_s, latency_s, psgd=psgd)
    return {"compute_ms": compute_ms, "compress_ms": compress, "all_reduce_ms": wire,
            "step_ms": compute_ms + compress + wire}


def gpt2_shapes(n_layers: int = 12, d_model: int = 768, vocab: int = 50257, n_ctx: int = 1024) -> list[list[int]]:
    """The parameter shapes of a GPT-2 (transformers' layout: Conv1D weights stored as in x out), 124 M
    parameters at the defaults: what a practitioner's all-reduce carries."""
    d = d_model
    layer = [[d], [d], [d, 3 * d], [3 * d], [d, d], [d], [d], [d], [d, 4 * d], [4 * d], [4 * d, d], [d]]
    return [[vocab, d], [n_ctx, d], *layer * n_layers, [d], [d]]
