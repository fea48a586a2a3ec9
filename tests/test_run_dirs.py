"""Runs never destroy runs (issue 11, item 2): a launch writes into its own directory and replaces the
old one only when complete; concurrent launches into one directory never touch each other."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

import ddplab
from ddplab import Experiment

pytestmark = pytest.mark.slow


def test_a_failed_rerun_of_the_same_spec_keeps_the_complete_run(tmp_path, monkeypatch):
    out = tmp_path / "same"
    exp = Experiment(name="same", model="tests.user_models:fails_if_flagged", world_size=2, steps=2)
    first = ddplab.run(exp, out, progress=False)
    monkeypatch.setenv("DDPLAB_TEST_FAIL", "1")
    with pytest.raises(ddplab.RunFailed) as err:
        ddplab.run(exp, out, progress=False)
    failed = err.value.run_dir
    assert failed != out and failed.parent == out.parent and failed.name.startswith("same.failed-"), failed
    assert (failed / "rank0.error.json").exists()
    again = ddplab.load_run(out)
    assert [r.envelope for r in again.ranks] == [r.envelope for r in first.ranks]
    assert not list(tmp_path.glob(".same.*.partial")) + list(tmp_path.glob(".same.*.old"))   # nothing left staged


def test_a_crashing_launch_does_not_touch_a_healthy_one_in_the_same_directory(tmp_path):
    out = tmp_path / "shared"
    script = textwrap.dedent("""
        import sys
        import ddplab
        from ddplab.spec import Fault
        kind, out = sys.argv[1], sys.argv[2]
        if kind == "healthy":
            exp = ddplab.Experiment(name="healthy", model="tests.user_models:slow", world_size=2, steps=400)
        else:
            exp = ddplab.Experiment(name="crashing", world_size=2, steps=2, fault=Fault("crash", step=0))
        try:
            ddplab.run(exp, out, progress=False)
            print("complete")
        except ddplab.RunFailed:
            print("failed")
    """)
    healthy = subprocess.Popen([sys.executable, "-c", script, "healthy", str(out)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".shared.*.partial/rank1.progress")):
        assert time.monotonic() < deadline and healthy.poll() is None, "the healthy launch never started"
        time.sleep(0.1)
    crashing = subprocess.run([sys.executable, "-c", script, "crashing", str(out)], capture_output=True, text=True,
                              timeout=120)
    assert crashing.stdout.strip() == "failed", crashing.stderr
    assert healthy.poll() is None, "the crashing launch took the healthy one down"   # it lasts >= 20 s
    said, _ = healthy.communicate(timeout=180)
    assert said.strip() == "complete"
    assert ddplab.load_run(out).spec.name == "healthy"


def test_a_destination_that_is_not_a_run_is_refused_before_launch(tmp_path):
    mine = tmp_path / "mywork"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"^out: .* not a ddplab run"):
        ddplab.run(Experiment(name="x"), mine, progress=False)
    with pytest.raises(ValueError, match=r"^out: '\.' names no directory of its own"):
        ddplab.run(Experiment(name="x"), ".", progress=False)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_failed_run_sits_beside_a_complete_run_from_an_older_launch_record(tmp_path):
    import json

    from ddplab import rundir

    final, staged = tmp_path / "old", tmp_path / ".old.abc123.partial"
    final.mkdir(), staged.mkdir()
    (final / rundir.LAUNCH).write_text(json.dumps({"returncode": 0}))   # before launches said "complete"
    (staged / "rank0.error.json").write_text("{}")
    place = rundir.settle(staged, final, complete=False)
    assert place == tmp_path / "old.failed-abc123" and (final / rundir.LAUNCH).exists()
