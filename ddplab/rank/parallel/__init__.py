"""Parallelism wrappers, one file each, side by side: `ddp` (torch DDP as the lab builds it),
`bucketed` (an explicit bucket plan), `zero` (ZeRO-1: sharded optimizer state), `fsdp` (FSDP2:
sharded parameters, gradients and state). Runs inside a rank.
Used by notebooks 01-06.
"""
