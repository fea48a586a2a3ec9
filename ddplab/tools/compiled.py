"""`--compile` for the practitioner tools (`ddplab audit --compile`, `ddplab tune-buckets --compile`, or
`compile_backend=` from Python): the user's model in DDP, eager and under `torch.compile(ddp, backend=...)`
with one `optimize_ddp` mode, at the caps the tool looked at, on the same ranks (the `CompiledDdp` task
of notebook 11). The report holds, per cap:

- the graphs the backend was handed and, under DDPOptimizer (torch's default mode), the split torch
  recorded (its own log of the buckets it cut the graph at), against DDP's own buckets in the same step;
- the gradients whose readiness hook fired in one compiled step, out of the trainable ones;
- the first step of each (compiling is in the compiled one), then the step, eager against compiled, on
  paired steps (`claims`: holds, contradicted or cannot resolve);
- whether both ended with the same parameters (the same start, batches and steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..spec import CompiledDdp, Experiment
from ..spec.compiled_ddp import BACKENDS, FIRST_BUCKET_MB, MODES
from ..spec.tasks import MODEL_FIELDS, RUN_FIELDS
from ..tables import compiled_ddp
from ..tables.compiled_ddp import SAME_TRAINING_REL
from .factory import records

WARMUP, ROUNDS, STEPS = 3, 6, 2   # 12 paired steps: the fewest `claims` judges at all


def compile_settings(backend, mode) -> tuple[str, str]:
    """(backend, mode) checked before any launch: a ValueError naming `compile_backend` or `compile_mode`."""
    if backend not in BACKENDS:
        raise ValueError(f"compile_backend: one of {', '.join(BACKENDS)} (aot_eager compiles in about a second a "
                         f"graph on 2 CPU cores; inductor generates code, far slower to compile) (got {backend!r})")
    if mode not in MODES:
        raise ValueError(f"compile_mode: torch._dynamo.config.optimize_ddp, one of {', '.join(MODES)} (got {mode!r})")
    return backend, mode


def compilable_caps(caps) -> tuple:
    """The caps (None: DDP's default) DDPOptimizer can split at: it asserts its 1 MiB first bucket fits the cap."""
    return tuple(c for c in dict.fromkeys(caps) if c is None or c >= FIRST_BUCKET_MB)


def compiled_experiment(base: Experiment, caps, backend: str, mode: str, rounds: int = ROUNDS,
                        steps: int = STEPS) -> Experiment:
    """`base`'s model, data and ranks in the compiled-DDP comparison at `caps`."""
    task = CompiledDdp(caps_mb=tuple(caps), backend=backend, modes=(mode,), warmup_steps=WARMUP, rounds=rounds,
                       steps_per_round=steps)
    fields = {k: getattr(base, k) for k in sorted((RUN_FIELDS | MODEL_FIELDS) - {"name", "task"})}
    return Experiment(name=f"{base.name}-compiled", task=task, **fields)


@dataclass
class CompiledReport:
    """The compiled section of a tool's report; `text()` to read, `to_dict()` as data."""

    backend: str
    mode: str
    trainable_tensors: int
    graphs: pd.DataFrame      # per compiled arm: graphs compiled, gradients seen ready, DDP buckets seen
    split: pd.DataFrame       # per cap under ddp_optimizer: torch's recorded split against DDP's buckets
    steps: pd.DataFrame       # per cap: first steps, median steps, the paired finding
    largest_param_gap: float  # compiled against eager parameters after the same steps, over arms and ranks
    path: str

    @classmethod
    def of(cls, run, trainable_tensors: int) -> "CompiledReport":
        task = run.spec.task
        split = compiled_ddp.split(run) if "ddp_optimizer" in task.modes else pd.DataFrame()
        gaps = [a.param_gap for r in run.ranks for a in r.result.arms if a.compiled]
        return cls(backend=task.backend, mode=", ".join(task.modes), trainable_tensors=trainable_tensors,
                   graphs=compiled_ddp.modes(run), split=split, steps=compiled_ddp.steps(run), largest_param_gap=max(gaps),
                   path=str(run.path))

    @property
    def split_is_torchs(self) -> bool:
        """The graphs the backend was handed are the ones DDPOptimizer's record accounts for, at every cap."""
        return bool((self.split["graphs_compiled"] == self.split["graphs_recorded"]).all()
                    and (self.split["unknown_names"] == 0).all()) if len(self.split) else True

    def to_dict(self) -> dict:
        return {"backend": self.backend, "mode": self.mode, "graphs": records(self.graphs),
                "split": records(self.split) if len(self.split) else [], "split_is_torchs": self.split_is_torchs,
                "steps": records(self.steps), "largest_param_gap": self.largest_param_gap,
                "same_training": self.largest_param_gap <= SAME_TRAINING_REL, "path": self.path}

    def text(self) -> str:
        out = [f"under torch.compile (backend {self.backend}, optimize_ddp={self.mode}), beside the same DDP eager "
               f"on the same ranks, batches and start:"]
        seen = self.graphs["gradients_seen_ready"]
        if self.mode == "python_reducer":
            out.append("graphs compiled per cap (compiled autograd traces the backward and the Python reducer's "
                       "all-reduces; the readiness probe is left out there, its hooks would cut the backward into a "
                       "graph per parameter): " + ", ".join(f"{a} {g}" for a, g in self.graphs["graphs_compiled"].items()))
        else:
            out.append("graphs compiled, and gradients seen ready in one compiled step (of "
                       f"{self.trainable_tensors} trainable): " + ", ".join(
                           f"{a} {g} graphs, {s} ready" for a, g, s in zip(self.graphs.index,
                                                                           self.graphs["graphs_compiled"], seen)))
        if len(self.split):
            out += ["DDPOptimizer's split, from torch's own record, against DDP's buckets (first bucket in MiB):",
                    self.split.round(3).to_string(),
                    *compiled_ddp.split_matches_ddp(self.split),
                    "the graphs the backend was handed are exactly the pieces of torch's recorded split"
                    if self.split_is_torchs else
                    "THE GRAPHS THE BACKEND WAS HANDED ARE NOT THE PIECES OF TORCH'S RECORDED SPLIT (a graph break, "
                    "or a recompile: see the run's log)"]
        out += ["the step, eager against compiled (first step in s, compiling included in the compiled one; then "
                "the median of the paired steps, each timed by its slowest rank, in ms):",
                self.steps.drop(columns=["compiled faster?"]).round(2).to_string(),
                *(f"{arm}: compiled faster? {said}" for arm, said in self.steps["compiled faster?"].items()),
                ("compiled and eager ended with the same parameters" if self.largest_param_gap <= SAME_TRAINING_REL
                 else "COMPILED AND EAGER ENDED WITH DIFFERENT PARAMETERS") +
                f" (largest relative difference {self.largest_param_gap:.1e}, over arms and ranks)"]
        return "\n".join(out)


__all__ = ["CompiledReport", "compilable_caps", "compile_settings", "compiled_experiment"]
