"""Do `ddplab audit` and `ddplab tune-buckets` finish on a GPT-2-style Hugging Face model with 4 ranks
within 2 minutes each (issue 19's target), run as a user runs them?

    python bench/practitioner_tools.py [--world-size 4] [--target-s 120] [--d-model 256] [--n-layers 6]

Runs both commands as subprocesses (`python -m ddplab.cli ...`, import and launch included) on
transformers' GPT2LMHeadModel built from a config (ddplab/examples/hf_gpt2.py), prints each one's wall
time, its report's headline numbers, and whether the target is met. Needs `pip install transformers`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "ddplab.examples.hf_gpt2:gpt2"


def timed(argv: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ddplab.cli", *argv, "--json", str(report), "--quiet",
                               "--out", str(Path(tmp) / "runs")], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"{argv[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return seconds, json.loads(report.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--target-s", type=float, default=120.0)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=6)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--local-batch", type=int, default=4)
    args = p.parse_args()
    common = ["--model", MODEL, "--world-size", str(args.world_size), "--local-batch", str(args.local_batch),
              "--vocab-size", str(args.vocab_size), "--d-model", str(args.d_model), "--n-layers", str(args.n_layers),
              "--n-heads", str(args.n_heads), "--seq-len", str(args.seq_len)]
    audit_s, audit = timed(["audit", *common, "--optimizer", "adam"])
    m, c = audit["model"], audit["compute"]
    print(f"audit: {audit_s:.1f} s; {m['parameters']:,} parameters, {len(audit['buckets'])} buckets, bucket rule "
          f"{'matches' if audit['bucket_rule']['matches'] else 'DIFFERS'}, bytes/formula "
          f"{audit['comm']['written_over_formula']:.3f}, compute/comm {c['compute_to_comm']:.2f}")
    tune_s, tune = timed(["tune-buckets", *common])
    print(f"tune-buckets: {tune_s:.1f} s; measured {', '.join(r['plan'] for r in tune['measured'])}; "
          f"recommendation {tune['recommendation']}: {tune['verdict']}")
    for name, s in (("audit", audit_s), ("tune-buckets", tune_s)):
        print(f"{name}: {s:.1f} s against the {args.target_s:.0f} s target: {'MET' if s <= args.target_s else 'NOT MET'}")


if __name__ == "__main__":
    main()
