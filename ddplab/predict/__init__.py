"""Pure models, numbers in and numbers out (no torch, no processes): `comm` (cost formulas and the
alpha-beta fit), `compression` (what a communication hook sends, and whether it pays), `buckets` (the bucket-schedule simulator), `memory` (per-rank memory of DDP),
`loss_weights` (how much each rank's gradient counts), `balance` (what a set of sequences costs a
rank, and two ways to split sequences over ranks), and chapter 09's `zero` (ZeRO's stages 0-3), `fsdp_memory`
(FSDP2's memory over one step), `tensor_parallel` (a split layer's collectives) and `pipeline` (the
bubble and a schedule replay). Notebooks put them beside measurements;
tests use real runs as their oracle."""

from . import balance, buckets, comm, compression, fsdp_memory, loss_weights, memory, pipeline, tensor_parallel, zero  # noqa: F401 (predict.<model>)
