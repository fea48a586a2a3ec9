"""The bucket sweep's spec (`spec/bucket_sweep.py`): plan names, and what a plan needs before launch."""

from __future__ import annotations

import dataclasses

import pytest

from ddplab.spec.bucket_sweep import Plan

def test_a_plan_on_twice_the_bandwidth_needs_a_link():
    from ddplab import recipes

    exp = recipes.split_on_link("1GbE", against_bandwidth=True)
    assert "ddp-2x:64" in exp.task.plans and "ddp:1" in exp.task.plans
    with pytest.raises(ValueError, match="task.plans.*ddp-2x.*no link"):
        dataclasses.replace(exp, link=None)


def test_the_plan_on_twice_the_bandwidth_parses_and_keeps_its_name():
    assert Plan.parse("ddp-2x:64") == Plan("ddp-2x", 64.0) and str(Plan("ddp-2x", 64.0)) == "ddp-2x:64"
    assert Plan.parse("ddp-2x:64").link_bandwidth == 2.0
    assert {Plan.parse(p).link_bandwidth for p in ("ddp:64", "ddp-split:64", "bare:default", "split:8")} == {1.0}
