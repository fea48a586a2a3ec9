"""Notebook 08, common errors (seed claim C18): four wrong claims about data parallelism, each measured
beside the right one on the same runs, all in one launch (`ddplab.run_many`).

1. strong scaling claimed after growing the global batch: weak runs (fixed local batch) beside strong
   runs (fixed global batch) on 1, 2 and 4 ranks;
2. model-state memory divided by the data-parallel degree: the memory ledger at 2 and 4 ranks;
3. summed all-reduce durations read as exposed overhead: one DDP step traced bucket by bucket, and
   the same step without synchronization;
4. source order assumed to be ready order: the branchy model's gradient-ready order.

`tables/common_errors.py` sorts the runs by error and sets the four side by side; each error's own table
lives with its concept (`tables/global_batch.py`, `tables/memory.py`, `tables/readiness.py`).
`common_error_groups` says which run belongs to which error.
"""

from __future__ import annotations

from ..spec import Experiment

# small enough that the whole launch (11 runs, up to 4 ranks) takes about 10 s on 2 CPU cores
ERRORS_MODEL = dict(d_model=64, n_layers=2, n_heads=4, vocab_size=64, seq_len=32)
# the overlap runs: 0.86 M parameters (3.3 MiB of float32 gradients in 53 tensors) in 0.5 MiB buckets:
# 7 once DDP has rebuilt them after step 0, 6 of them launched while backward still computes
OVERLAP_MODEL = dict(d_model=128, n_layers=4, n_heads=4, vocab_size=256, seq_len=32, local_batch=8)
OVERLAP_BUCKET_CAP_MB = 0.5
PREFIX = "errors-"   # every name is PREFIX + group + "-" + what: tables/common_errors.py groups by it


def common_error_groups(global_batch: int = 32, world_sizes=(1, 2, 4), memory_world_sizes=(2, 4), steps: int = 12,
                        overlap_steps: int = 20, **overrides) -> dict[str, list[Experiment]]:
    """The experiments of each error, by name: "weak" and "strong" (one per world size in
    `world_sizes`; the weak runs keep the local batch that the strong runs have on the most ranks),
    "memory" (one per world size in `memory_world_sizes`, the same global batch), "overlap" ([DDP
    traced with the readiness probe, the same step without synchronization]) and "ready" ([the
    branchy model traced with the readiness probe]). `overrides` apply to every experiment."""
    for w in (*world_sizes, *memory_world_sizes):
        if global_batch % w:
            raise ValueError(f"common_errors: global_batch={global_batch} does not split evenly over {w} ranks")
    local = global_batch // max(world_sizes)
    scaling = dict(**ERRORS_MODEL, steps=steps)
    memory = dict(**ERRORS_MODEL, steps=2, optimizer="adam", probes=("memory",))
    overlap = dict(**OVERLAP_MODEL, world_size=2, steps=overlap_steps)

    def exp(group: str, what: str, **fields) -> Experiment:
        return Experiment(name=f"{PREFIX}{group}-{what}", **{**fields, **overrides})

    return {
        "weak": [exp("weak", f"w{w}", world_size=w, local_batch=local, **scaling) for w in world_sizes],
        "strong": [exp("strong", f"w{w}", world_size=w, local_batch=global_batch // w, **scaling)
                   for w in world_sizes],
        "memory": [exp("memory", f"w{w}", world_size=w, local_batch=global_batch // w, **memory)
                   for w in memory_world_sizes],
        "overlap": [exp("overlap", "ddp", bucket_cap_mb=OVERLAP_BUCKET_CAP_MB, probes=("readiness",), **overlap),
                    exp("overlap", "compute-only", sync="none", **overlap)],
        "ready": [exp("ready", "branchy", model="branchy", world_size=2, local_batch=4, steps=2, d_model=32,
                      vocab_size=32, seq_len=8, probes=("readiness",))],
    }


def common_error_runs(**kwargs) -> list[Experiment]:
    """Notebook 08: every experiment of `common_error_groups(**kwargs)` as one list, for one
    `ddplab.run_many` launch (the 1- and 2-rank runs use the launch's first ranks). The weak and strong
    runs alternate, smallest world size first, so a drift of this machine's speed hits both alike."""
    g = common_error_groups(**kwargs)
    scaling = [e for pair in zip(g["weak"], g["strong"]) for e in pair]
    return [*scaling, *g["memory"], *g["overlap"], *g["ready"]]
