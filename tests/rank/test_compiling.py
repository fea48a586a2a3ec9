"""Compile marks in a rank's progress log survive torch._dynamo.reset(), which clears Dynamo's callbacks
(the compiled_ddp task resets before each block; a warm session runs many jobs in one process)."""

from __future__ import annotations

import torch

from ddplab import rundir
from ddplab.rank import compiling
from ddplab.spec.tasks import COMMON_PHASES


def _marks(run_dir) -> list:
    return [r["compiling"] for r in rundir.read_progress(run_dir, 0) if "compiling" in r]


def _compile_once(k: float) -> None:
    f = torch.compile(lambda x: x * k + 1, backend="eager")
    f(torch.ones(3))


def test_compile_marks_come_back_after_dynamo_reset(tmp_path):
    log = rundir.ProgressLog(tmp_path, 0, {p.name: p for p in COMMON_PHASES})
    try:
        torch._dynamo.reset()
        compiling.at(log, 0)
        _compile_once(2.0)
        assert _marks(tmp_path) == [True, False]
        torch._dynamo.reset()   # clears every callback Dynamo holds
        compiling.again()
        _compile_once(3.0)
        assert _marks(tmp_path) == [True, False, True, False]
        torch._dynamo.reset()
        compiling.at(log, 0)    # the next job in a warm session arms again
        _compile_once(4.0)
        assert _marks(tmp_path) == [True, False] * 3
        compiling.again()       # registering twice would mark twice
        _compile_once(5.0)
        assert _marks(tmp_path) == [True, False] * 4
    finally:
        compiling.stop()
        log.close()
        torch._dynamo.reset()
