"""Bad input to a spec, a --spec file or the checkpoint key is a ValueError naming the
field or the file, before anything trains (each was a raw error, or a refusal after the run, before)."""

from __future__ import annotations

import os
import re
import stat

import pytest

from ddplab import Experiment, cli
from ddplab.spec.resume import Resume

SAVING = dict(world_size=2, steps=4, local_batch=2, seq_len=8)


@pytest.mark.parametrize("where", ["a" * 300, "/" + "b/" * 3000])
def test_a_resume_from_no_system_can_open_names_resume_from(where):
    with pytest.raises(ValueError, match=r"^Experiment\.task\.resume_from: 'a{80}' is not a path this system can "
                                         r"open \(File name too long\)$" if where[0] == "a" else
                       r"^Experiment\.task\.resume_from: .* is not a path this system can open"):
        Experiment(task=Resume(resume_from=where), **SAVING)


def test_a_checkpoint_key_others_can_read_is_refused_before_the_saving_run_trains(tmp_path, monkeypatch):
    key = tmp_path / "shared.key"
    key.write_text("ab" * 32)
    monkeypatch.setenv("DDPLAB_KEY_FILE", str(key))
    key.chmod(0o600)
    Experiment(task=Resume(save_at=2), **SAVING)   # this account's alone: accepted
    key.chmod(0o644)
    with pytest.raises(ValueError, match=r"^Experiment\.task\.save_at: the checkpoint it saves is sealed with this "
                                         r"account's key, and .*shared\.key, the checkpoint key, must belong to "
                                         r"this account and be readable by it alone \(chmod 600"):
        Experiment(task=Resume(save_at=2), **SAVING)
    assert stat.S_IMODE(key.stat().st_mode) == 0o644   # said, not silently changed


def test_a_key_opened_to_others_after_the_experiment_was_built_is_refused_at_launch(tmp_path, monkeypatch):
    """The launcher checks the key again: nothing starts, no run directory is made."""
    import ddplab

    key = tmp_path / "shared.key"
    key.write_text("ab" * 32)
    key.chmod(0o600)
    monkeypatch.setenv("DDPLAB_KEY_FILE", str(key))
    exp = Experiment(task=Resume(save_at=2), **SAVING)
    key.chmod(0o644)
    with pytest.raises(ValueError, match=r"shared\.key, the checkpoint key, must belong to this account"):
        ddplab.run(exp, tmp_path / "out", progress=False, warm=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_a_checkpoint_key_that_is_a_folder_is_refused_before_the_saving_run_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPLAB_KEY_FILE", str(tmp_path))
    with pytest.raises(ValueError, match=r"^Experiment\.task\.save_at: .*the checkpoint key, is not a file"):
        Experiment(task=Resume(save_at=2), **SAVING)


def test_a_missing_key_is_still_made_when_the_saving_run_seals(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPLAB_KEY_FILE", str(tmp_path / "new" / "checkpoint.key"))
    Experiment(task=Resume(save_at=2), **SAVING)
    assert not (tmp_path / "new").exists()   # checking makes nothing


@pytest.mark.parametrize("text, says", [
    ("this is not json", r"spec: {f} is not JSON \(Expecting value: line 1 column 1"),
    ('{"world_size": 2,', r"spec: {f} is not JSON"),
    ('{"lr": -1}', r"spec: {f}: Experiment\.lr: must be a positive number"),
    ('{"zz": 1}', r"spec: {f}: .*zz"),
])
def test_a_spec_file_that_is_not_a_spec_is_named(tmp_path, capsys, text, says):
    f = tmp_path / "spec.txt"
    f.write_text(text)
    code = cli.main(["run", "--spec", str(f), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(says.format(f=re.escape(str(f))), err), err
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in err and os.path.exists(f)
