"""The rank side: code that runs inside a torchrun rank, the only code that talks to a process group.

    worker.py   the entry point (`python -m ddplab.rank.worker`): setup, run each task, write records, teardown
    tasks/      one module per task: train (a short DDP training script), allreduce_sweep, bucket_sweep
    probes/     what a training rank records, attached by name: gradients, readiness, buckets, memory, ...
    parallel/   the wrappers side by side: ddp, bucketed (explicit bucket plans), zero, fsdp
    models.py, data.py, reference.py, training.py, runtime.py, smoke.py (`ddplab doctor`'s check)
Used by every notebook's runs (torchrun starts `rank/worker.py`).
"""
