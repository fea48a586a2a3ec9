"""torch DDP, built one way for every task: rank 0's parameters broadcast at construction, gradients
averaged bucket by bucket during backward (docs/ddp-internals.md, "Buckets" and "The bucket rebuild").

`bucket_cap_mb=None` keeps DDP's default (25 MiB, and a 1 MiB first bucket after the rebuild); any
explicit value sets the first bucket too. `bucket_cap_mb_list` gives each bucket its own cap (torch
2.13): at construction over the parameters in definition order (then the bucket list is reversed),
and at the rebuild over the ready order. Used by the train task and the bucket sweep.
"""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel


def wrap_in_ddp(module, device, group=None, bucket_cap_mb: float | None = None, gradient_as_bucket_view: bool = False,
         find_unused_parameters: bool = False, bucket_cap_mb_list: list[float] | None = None) -> DistributedDataParallel:
    """DDP over the ranks of `group` (None: all ranks); a collective: every rank must call it."""
    extra = {"bucket_cap_mb_list": list(bucket_cap_mb_list)} if bucket_cap_mb_list else {}
    return DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None,
                                   bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gradient_as_bucket_view,
                                   find_unused_parameters=find_unused_parameters, process_group=group, **extra)

