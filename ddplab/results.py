"""`Run` and `RankResult`: a finished run directory, loaded and cross-checked.

`load_run(path)` accepts a run only if every rank wrote a `rank{r}.json` that matches the record
schema (`record/`) for the same spec and launch, and, where DDP synchronizes, every rank holds the
same parameters after every step; anything less raises `RunFailed` naming the rank or the step.
A `RankResult` is the rank's envelope and its task's typed record (`result`): a `TrainRecord` for
training, with `steps`, `param_checksum`, `model`, `reference` and `memory` at hand. Used by every
notebook, the tables and the plots.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import record, rundir
from .failures import Diagnosis, RunFailed
from .spec import Experiment
from .spec.checks import reading_a_record


@dataclass(frozen=True)
class RankResult:
    """What one rank recorded: its envelope (who, where, which launch) and its task's record."""

    envelope: record.Envelope
    result: object

    rank = property(lambda self: self.envelope.rank)
    world_size = property(lambda self: self.envelope.world_size)
    backend = property(lambda self: self.envelope.backend)
    device = property(lambda self: self.envelope.device)
    pid = property(lambda self: self.envelope.pid)
    host = property(lambda self: self.envelope.host)

    # the train task's record, at hand
    steps = property(lambda self: self.result.steps)
    param_checksum = property(lambda self: self.result.param_checksum)
    model = property(lambda self: self.result.model)
    reference = property(lambda self: self.result.reference)
    memory = property(lambda self: self.result.memory)
    parameter_names = property(lambda self: self.result.parameter_names)

    @property
    def sample_ids(self) -> list[int]:
        """Every global sample id this rank consumed, in order, over all steps."""
        return [i for s in self.steps for i in s.sample_ids]

    def step_ms(self, phase: str = "step") -> list[float]:
        """Per-step time of one phase ("data", "forward", "backward", "optimizer" or "step")."""
        return [s.step_ms if phase == "step" else s.phase_ms.get(phase, 0.0) for s in self.steps]


@dataclass(frozen=True)
class Run:
    """A finished run: its directory, its spec and one `RankResult` per rank."""

    path: Path
    spec: Experiment
    ranks: list[RankResult]
    launch: dict = field(default_factory=dict, repr=False)

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def _steps(self, method: str, fields: tuple[str, ...]) -> int:
        """How many steps every rank recorded; ValueError naming `method` if this task records no steps
        with `fields` (a sweep, a study: its chapter's tables read it)."""
        steps = [getattr(r.result, "steps", None) for r in self.ranks]
        if not steps or any(not isinstance(s, list) or not all(hasattr(st, f) for st in s for f in fields)
                            for s in steps):
            raise ValueError(f"Run.{method}: {self.spec.name!r} is a {self.spec.task.kind} run, whose ranks record "
                             f"no training steps with {' and '.join(fields)}; the tables of its chapter read it")
        return min(len(s) for s in steps)

    def step_ms(self, warmup: int = 0) -> list[float]:
        """Wall time of each step the ranks recorded, after `warmup` of them: the slowest rank's, since a
        synchronous step is done only when every rank is (a resume records only the steps it ran)."""
        recorded = self._steps("step_ms", ("step_ms",))
        return [max(r.steps[i].step_ms for r in self.ranks) for i in range(warmup, recorded)]

    def global_loss(self) -> list[float]:
        """Per recorded step, the mean token loss over the whole global batch (all ranks' tokens)."""
        return [sum(r.steps[i].loss_sum for r in self.ranks) / sum(r.steps[i].tokens for r in self.ranks)
                for i in range(self._steps("global_loss", ("loss_sum", "tokens")))]

    def diverged(self) -> str | None:
        """Where the loss first stopped being a finite number (the first step and the ranks whose loss
        was NaN or infinite there), said as a sentence; None if it stayed finite, or the task records no
        training loss. A diverged run ran correctly: it is training that failed (lr too high?)."""
        import math

        steps = [getattr(r, "steps", None) for r in self.ranks]
        if not steps or any(s is None for s in steps):
            return None
        for i in range(min(len(s) for s in steps)):
            bad = [r.rank for r, s in zip(self.ranks, steps) if not math.isfinite(getattr(s[i], "loss", 0.0))]
            if bad:
                how = {repr(steps[b][i].loss) for b in bad}
                return (f"the loss became {'/'.join(sorted(how))} at step {steps[0][i].step} on rank(s) "
                        f"{', '.join(map(str, bad))}: training diverged (lr={self.spec.lr:g}; try a smaller one)")
        return None

    def tensors(self, rank: int) -> dict:
        """The tensors rank saved (probes), loaded safely with weights_only=True."""
        import pickle

        import torch

        path = rundir.tensor_file(self.path, rank)
        if not path.is_file() or path.is_symlink():
            raise _invalid(rank, f"of tensors ({path.name}) is {'missing' if not path.exists() else 'not a file'}: "
                                 f"the probes that save tensors wrote none, or it was removed", self.path)
        try:
            return torch.load(path, weights_only=True)
        except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, OSError) as e:
            raise _invalid(rank, f"of tensors ({path.name}) is damaged or not one this lab wrote ({type(e).__name__}: "
                                 f"{(str(e).splitlines() or [''])[0][:200]}); run it again", self.path) from e

    def __repr__(self) -> str:
        return f"Run({self.spec.name!r}, world_size={self.world_size}, path='{self.path}')"


class NotARun(FileNotFoundError, ValueError):
    """`load_run` of a directory that holds no run (a FileNotFoundError, and a ValueError like every
    other refusal of bad input)."""


def _invalid(rank: int, why: str, path: Path) -> RunFailed:
    return RunFailed(Diagnosis("invalid-result", [rank], f"Rank {rank}'s result file {why}."), path)


def load_rank(path: Path, rank: int, spec: Experiment) -> RankResult:
    """Load and check one rank's file; RunFailed if it is missing, corrupt or from another run."""
    f = rundir.rank_file(path, rank)
    if not f.exists():
        raise RunFailed(Diagnosis("missing-result", [rank], f"Rank {rank} wrote no result ({f.name} is missing)."), path)
    if not f.is_file():
        raise _invalid(rank, "is not a file", path)
    try:
        rec = record.load(json.loads(f.read_text()), spec.task.record)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _invalid(rank, f"is not valid JSON ({e})", path) from e
    except RecursionError:
        raise _invalid(rank, "is nested too deeply to be a rank's record", path) from None
    except record.RecordError as e:
        raise _invalid(rank, str(e), path) from e
    env = rec.envelope
    if env.rank != rank or env.world_size != spec.world_size:
        raise _invalid(rank, f"claims rank {env.rank} of {env.world_size}, expected rank {rank} of "
                             f"{spec.world_size}", path)
    if env.spec_hash != spec.hash:
        raise _invalid(rank, f"belongs to spec {env.spec_hash}, not to this run's spec {spec.hash}", path)
    steps = getattr(rec.result, "steps", None)
    if isinstance(rec.result, record.TrainRecord) and len(steps) != spec.steps:
        raise _invalid(rank, f"has {len(steps)} steps, expected {spec.steps}", path)
    for st in steps if isinstance(steps, list) else []:
        if not _loss_agrees(st):
            raise _invalid(rank, f"says step {st.step}'s loss is {st.loss!r}, and its loss_sum / tokens is "
                                 f"{st.loss_sum!r} / {st.tokens!r}: the rank wrote both from one sum", path)
    return RankResult(env, rec.result)


def _loss_agrees(step) -> bool:
    """A step's loss is its loss_sum over its tokens, as the rank computed both (a diverged run's are
    NaN or infinite together); a step of a task that records no loss agrees trivially."""
    import math

    loss, total, tokens = (getattr(step, f, None) for f in ("loss", "loss_sum", "tokens"))
    if loss is None or total is None or not tokens:
        return True
    mean = total / tokens
    if math.isnan(loss) or math.isnan(mean):
        return math.isnan(loss) and math.isnan(mean)
    return math.isclose(loss, mean, rel_tol=1e-4, abs_tol=1e-6) or loss == mean


def load_run(path) -> Run:
    """Reload a finished run directory; RunFailed unless every rank's result is present, valid, from
    one and the same launch, and no rank reported an error."""
    if not isinstance(path, (str, Path)) or isinstance(path, str) and not path:
        raise ValueError(f"path: a run directory (a str or a Path, as ddplab.run returns in Run.path), "
                         f"not {type(path).__name__} {str(path)[:60]!r}")
    path = Path(path)
    spec_file = path / rundir.SPEC
    if not spec_file.exists():
        raise NotARun(f"{path} is not a ddplab run directory: {rundir.SPEC} is missing")
    if not spec_file.is_file():
        raise ValueError(f"{spec_file} is not a file; the run directory is damaged: run it again")
    try:
        with reading_a_record():
            spec = Experiment.from_json(spec_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{spec_file} is not a valid spec ({e}); the run directory is damaged: run it again") from e
    launch_file = path / rundir.LAUNCH
    try:
        launch = json.loads(launch_file.read_text()) if launch_file.exists() else {}
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{launch_file} is not the launcher's record ({e}); the run directory is damaged: "
                         f"run it again") from None
    if not isinstance(launch, dict):
        raise ValueError(f"{launch_file} is not the launcher's record (a JSON object); the run directory is "
                         f"damaged: run it again")
    ranks = [load_rank(path, r, spec) for r in range(spec.world_size)]
    ids = {r.envelope.launch_id for r in ranks}
    if not launch.get("launch_id") and len(ids) > 1:   # no launch.json to compare with: they must agree
        raise _invalid(ranks[-1].rank, f"comes from another launch than rank {ranks[0].rank}'s (launch ids "
                                       f"{', '.join(sorted(map(str, ids)))}): two launches wrote here", path)
    for r in ranks:
        if rundir.error_file(path, r.rank).exists():
            raise _invalid(r.rank, f"sits beside {rundir.error_file(path, r.rank).name}: the rank failed after writing it", path)
        if launch.get("launch_id") and r.envelope.launch_id != launch["launch_id"]:
            raise _invalid(r.rank, "comes from another launch than the run's launch.json (two launches wrote here)", path)
        if "gradients" in spec.probes and not rundir.tensor_file(path, r.rank).exists():
            raise _invalid(r.rank, f"has no {rundir.tensor_file(path, r.rank).name}, though the gradients probe was on", path)
        if spec.task.kind == "train":   # what every training rank records, and what each probe adds
            if not getattr(r.result, "parameter_names", None):
                raise _invalid(r.rank, "names no parameter (every training rank records its model's)", path)
            if "memory" in spec.probes and getattr(r.result, "memory", None) is None:
                raise _invalid(r.rank, "has no memory ledger, though the memory probe was on", path)
    if spec.task.kind == "train" and spec.sync == "ddp":
        _check_replicas_agree(spec, ranks, path)
    return Run(path, spec, ranks, launch)


def _check_replicas_agree(spec: Experiment, ranks: list[RankResult], path: Path) -> None:
    """After every synchronized step all replicas must be bit-identical; a run where they are not
    completed without synchronizing (DDP never reduced a bucket), which is a failure, not a result."""
    for i in range(spec.steps):
        checksums = [r.steps[i].param_checksum for r in ranks]
        if len(set(checksums)) == 1:
            continue
        unused = list(dict.fromkeys(n for r in ranks for n in r.result.unused_parameters))  # in parameter order
        why = (f"The parameter(s) {', '.join(unused[:6])}{' ...' if len(unused) > 6 else ''} got no gradient in "
               f"step 0: no forward used them, so DDP never reduced the bucket holding them and each rank stepped "
               f"on its own gradient. Use them in forward, freeze them (requires_grad=False), or set "
               f"find_unused_parameters=True." if unused else
               "Every parameter got a gradient, so something outside DDP changed one replica's parameters.")
        raise RunFailed(Diagnosis("diverged", [r.rank for r in ranks],
                                  f"The replicas differ after step {i} although DDP should have synchronized them "
                                  f"(parameter checksums {', '.join(checksums)}). {why}"), path)
