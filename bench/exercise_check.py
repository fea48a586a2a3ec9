"""How long does the exercise's checker take on this machine, for a built-in and a GPT-2-style model?

    python bench/exercise_check.py [--world-size 4]

For each network: the learner's two runs (the evidence run and the gradient check case, one launch),
the reference evidence filled from them (exercises/instructor/reference.py), then `exercise.check`
timed twice: launching its own ranks (a script, `warm=False`) and as a notebook runs it, a job for
the warm ranks of a session. Prints the seconds and whether each check passed every finding.
Target (issue 14): `exercise.check` on 4 ranks in at most 60 s on this 2-core machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import ddplab
from ddplab import Experiment, exercise
from ddplab.launch import session as sessions

TARGET_S = 60.0
NETWORKS = {
    "built-in transformer": dict(model="transformer", d_model=64, n_layers=2, n_heads=4, vocab_size=64, seq_len=16),
    "GPT-2-style (ddplab.examples.gpt2_style)": dict(model="ddplab.examples.gpt2_style:gpt2", d_model=128,
                                                     n_layers=4, n_heads=4, vocab_size=512, seq_len=32),
}


def reference():
    path = Path(__file__).resolve().parents[1] / "exercises" / "instructor" / "reference.py"
    spec = importlib.util.spec_from_file_location("exercise_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=4)
    args = p.parse_args()
    ref = reference()
    d = args.world_size
    with tempfile.TemporaryDirectory() as tmp:
        import os

        os.environ["DDPLAB_RUNS"] = str(Path(tmp) / "runs")
        met = True
        for label, sizes in NETWORKS.items():
            exp = Experiment(name="bench-exercise", world_size=d, local_batch=4, accum_steps=2, steps=2,
                             optimizer="adam", bucket_cap_mb=0.25, **sizes)
            run, case = ddplab.run_many([exercise.evidence_run(exp), exercise.check_case(exp, range(1, d + 1))],
                                        Path(tmp) / label.split()[0], progress=False, warm=False)
            ev = ref.fill(exp, run, case)
            t0 = time.monotonic()
            cold = exercise.check(ev, progress=False)        # no session open: its own torchrun launch
            cold_s = time.monotonic() - t0
            with ddplab.Session(world_size=d, runs_dir=Path(tmp) / "runs"):
                t0 = time.monotonic()
                warm = exercise.check(ev, progress=False)
                warm_s = time.monotonic() - t0
            sessions.close_current()
            ok = cold.passed() and warm.passed()
            met &= ok and cold_s <= TARGET_S
            print(f"{label}, {d} ranks, {run.ranks[0].model.parameter_count:,} parameters: exercise.check "
                  f"{cold_s:.1f} s launching its own ranks, {warm_s:.1f} s on a warm session "
                  f"({len(cold.findings)} checks, all passed: {ok}); target <= {TARGET_S:.0f} s: "
                  f"{'met' if ok and cold_s <= TARGET_S else 'NOT met'}")
    print("target met" if met else "target NOT met")


if __name__ == "__main__":
    main()
