"""Runs never destroy runs: a launch writes into its own directory and replaces the
old one only when complete; concurrent launches into one directory never touch each other."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import ddplab
from ddplab import Experiment, rundir

pytestmark = pytest.mark.slow


def test_a_failed_rerun_of_the_same_spec_keeps_the_complete_run(tmp_path, monkeypatch):
    out = tmp_path / "same"
    exp = Experiment(name="same", model="tests.support.user_models:fails_if_flagged", world_size=1, steps=2)
    first = ddplab.run(exp, out, progress=False)
    monkeypatch.setenv("DDPLAB_TEST_FAIL", "1")
    with pytest.raises(ddplab.RunFailed) as err:
        ddplab.run(exp, out, progress=False)
    failed = err.value.run_dir
    assert failed != out and failed.parent == out.parent and failed.name.startswith("same.failed-"), failed
    # the failed launch's own files are kept (its rank's error file)
    assert list(failed.glob("rank*.error.json")), sorted(p.name for p in failed.iterdir())
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
            exp = ddplab.Experiment(name="healthy", model="tests.support.user_models:held", world_size=1, steps=2)
        else:
            exp = ddplab.Experiment(name="crashing", world_size=1, steps=2, fault=Fault("crash", step=0))
        try:
            ddplab.run(exp, out, progress=False)
            print("complete")
        except ddplab.RunFailed:
            print("failed")
    """)
    hold = tmp_path / "hold"   # the healthy run's forward waits while this file exists
    hold.touch()
    env = {**os.environ, "DDPLAB_TEST_HOLD": str(hold)}
    healthy = subprocess.Popen([sys.executable, "-c", script, "healthy", str(out)], stdout=subprocess.PIPE, text=True,
                               env=env)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".shared.*.partial/rank0.progress")):
        assert time.monotonic() < deadline and healthy.poll() is None, "the healthy launch never started"
        time.sleep(0.1)
    crashing = subprocess.run([sys.executable, "-c", script, "crashing", str(out)], capture_output=True, text=True,
                              timeout=120)
    assert crashing.stdout.strip() == "failed", crashing.stderr
    assert healthy.poll() is None, "the crashing launch took the healthy one down"   # held until now
    hold.unlink()
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


def _staged(run_dir):
    return next(iter(run_dir.parent.glob(f".{run_dir.name}.*.partial")), None)


def test_a_run_directory_deleted_mid_run_is_a_run_failed_not_a_bare_oserror(tmp_path):
    """Deleting the run directory under live ranks stops them at once and says what happened
    (it was a bare FileNotFoundError after the ranks had run to the end)."""
    import shutil

    from tests.support import leftovers

    run_dir = tmp_path / "gone"
    script = textwrap.dedent(f"""
        import time, ddplab
        exp = ddplab.Experiment(world_size=1, steps=10_000, local_batch=8, timeout_s=30)
        t0 = time.monotonic()
        try:
            ddplab.run(exp, {str(run_dir)!r}, progress=False)
        except ddplab.RunFailed as e:
            print("KIND", e.diagnosis.kind, round(time.monotonic() - t0))
            print(e.diagnosis.summary)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ((staged := _staged(run_dir)) and rundir.read_progress(staged, 0)
               and rundir.read_progress(staged, 0)[-1]["step"] >= 1):
        assert time.monotonic() < deadline and proc.poll() is None, "the run never got going"
        time.sleep(0.2)
    shutil.rmtree(staged)
    t_removed = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    assert "KIND run-dir" in out, out
    assert "could not be written or read" in out and "must stay in place and writable" in out, out
    assert time.monotonic() - t_removed < 15, "the launcher should notice within a poll, not at the 10 000th step"
    assert not leftovers(run_dir)


def test_a_path_inside_a_staging_directory_maps_to_where_it_settles(tmp_path):
    from ddplab.rundir import final_dir, staging_dir

    final = tmp_path / "runs" / "saved-ab12"
    assert final_dir(staging_dir(final, "0123456789ab") / "checkpoint") == final / "checkpoint"
    launch = tmp_path / "sweep.v2"   # a launch of several runs is staged as a whole, dots in its name and all
    assert final_dir(staging_dir(launch, "id1") / "run-a" / "checkpoint") == launch / "run-a" / "checkpoint"
    assert final_dir(final / "checkpoint") == final / "checkpoint"
    assert final_dir(tmp_path / ".hidden" / "x") == tmp_path / ".hidden" / "x"


def test_a_path_below_the_current_directory_is_shown_relative(tmp_path, monkeypatch):
    from ddplab.rundir import shown

    monkeypatch.chdir(tmp_path)
    assert shown(tmp_path / "runs" / "chapter-03-ab") == "runs/chapter-03-ab"
    assert shown(tmp_path.parent / "elsewhere") == str(tmp_path.parent / "elsewhere")
