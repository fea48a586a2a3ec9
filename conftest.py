"""For every pytest run from the repository root (tests/, notebooks/ and exercises/ alike).

nbval waits at most 5 seconds (`output_timeout`, set on each cell item) for each next message of a cell's output
after the cell has finished, and fails the cell if none comes: on a loaded machine a figure's or a
progress bar's message can come later than that (a run on 4 workers failed notebook 07's first cell
so, after it had run to the end; later, with 60 s, a machine slowed to a third of its speed did too).
The cell's own time limit is pytest-timeout's; this only lets the output that the kernel sent arrive.
"""

from __future__ import annotations

NBVAL_OUTPUT_WAIT_S = 180   # a fresh-clone run on a slowed machine waited over 60 s (bench/ci_runs.log, 2026-12-06)


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):   # nbval's cell items
            item.output_timeout = NBVAL_OUTPUT_WAIT_S


def pytest_collection_finish(session):
    """What this process imported to collect (torch, pandas, every test module) lives as long as it does:
    freeze it out of the collections the tests' garbage causes (as the ranks do, `host.import_torch_frozen`)."""
    import gc

    gc.freeze()
