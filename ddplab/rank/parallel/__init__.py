"""Parallelism wrappers, one file each, side by side: `ddp` (torch DDP as the lab builds it),
`bucketed` (an explicit bucket plan), `zero` (ZeRO-1: sharded optimizer state), `fsdp` (FSDP2:
sharded parameters, gradients and state), `tensor` (a layer split inside itself over the ranks, DTensor),
`pipeline` (the model cut into stages, torch.distributed.pipelining). Runs inside a rank.
Used by notebooks 01-06 and 09.
"""
