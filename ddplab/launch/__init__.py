"""The parent side of a run: start the ranks, watch them, collect and diagnose what they leave.

`cold` launches torchrun afresh for each run (`run`, `run_many`); `torchrun` builds the command and
kills the process tree; `preflight` refuses what cannot run before anything starts; `watch` follows
the ranks' progress logs; `progress` draws the one-line progress report. Runs in the notebook's process.
"""

from .cold import run, run_many

__all__ = ["run", "run_many"]
