"""A `%%ddp` cell inside a rank (`rank/cells.py`): its `dist` notes each collective it is called for,
numbered from 1 in every cell, so what the learner reads counts the cell's own collectives."""

from __future__ import annotations

import json

from ddplab.rank import cells


class _Dist:
    """torch.distributed as far as the cell below calls it: each call sees the status the cell noted first."""

    def __init__(self, status):
        self.status, self.seen = status, []

    def all_reduce(self, tensor):
        self.seen.append(json.loads(self.status.read_text()))


def test_a_cells_collectives_are_numbered_from_1_in_every_cell(tmp_path):
    status = tmp_path / "job3.rank0.cell.status"
    fake = _Dist(status)
    ns = {"dist": cells.TracedDist(fake)}
    assert cells.run_cell("dist.all_reduce(1)\ndist.all_reduce(2)", ns, status)["error"] is None
    assert [(s["op"], s["n"], s["done"]) for s in fake.seen] == [("all_reduce", 1, False), ("all_reduce", 2, False)]
    assert json.loads(status.read_text())["done"] is True
    cells.run_cell("dist.all_reduce(3)", ns, status)   # the next cell counts from 1 again
    assert fake.seen[-1]["n"] == 1
