"""No file the lab reads runs code: a checkpoint is read only as this lab sealed it (ddplab/seal.py), and
reading a spec never imports a module the spec names (spec/tasks.py). Each case feeds the damaged or
malicious file and sees the refusal name it, with no code run."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import ddplab
from ddplab import Experiment, seal
from ddplab.recipes import resume as recipes
from ddplab.results import load_run
from ddplab.spec.checks import reading_a_record
from ddplab.spec.resume import checkpoint_dir
from tests.tasks.test_resume import MODEL, resume_of, saving_run_dir

ROOT = Path(__file__).resolve().parents[2]


class _Marker:
    """A pickle that, when loaded, writes a file: what a malicious .metadata would do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "code ran"))


def test_a_sealed_checkpoint_verifies_also_after_a_move(tmp_path):
    d = saving_run_dir(tmp_path)
    seal.verify(d, checkpoint_dir(d))
    moved = shutil.move(d, tmp_path / "elsewhere")
    seal.verify(moved, checkpoint_dir(moved))
    resume_of(moved)   # the spec's check passes on the moved run


def test_the_key_is_made_once_and_only_this_account_can_read_it(tmp_path, monkeypatch):
    key = tmp_path / "cfg" / "checkpoint.key"
    monkeypatch.setenv("DDPLAB_KEY_FILE", str(key))
    d = saving_run_dir(tmp_path)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    first = key.read_text()
    seal.sign(d, checkpoint_dir(d))
    assert key.read_text() == first


@pytest.mark.parametrize("damage, said", [
    (lambda cp: (cp / ".metadata").write_bytes(b"changed"), r"\.metadata \(changed\)"),
    (lambda cp: (cp / "__9_0.distcp").write_bytes(b"x"), r"__9_0\.distcp \(added\)"),
    (lambda cp: (cp / "rank1.state.pt").unlink(), r"rank1\.state\.pt \(missing\)"),
])
def test_a_changed_added_or_missing_file_is_refused_naming_it(tmp_path, damage, said):
    d = saving_run_dir(tmp_path)
    damage(checkpoint_dir(d))
    with pytest.raises(ValueError, match=said):
        seal.verify(d, checkpoint_dir(d))


def test_a_malicious_metadata_is_refused_before_anything_unpickles_it(tmp_path):
    d = saving_run_dir(tmp_path)
    marker = tmp_path / "marker"
    (checkpoint_dir(d) / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))
    with pytest.raises(ValueError, match=r"Experiment\.task\.resume_from: .*\.metadata \(changed\).*can run code"):
        resume_of(d)
    with pytest.raises(ValueError, match=r"\.metadata \(changed\)"):
        recipes.resumes(d)   # the issue's own repro: ddplab.run(recipes.resume.resumes(copy)[0])
    assert not marker.exists()
    pickle.loads((checkpoint_dir(d) / ".metadata").read_bytes())   # the pickle does run code when loaded
    assert marker.exists()


def test_a_checkpoint_sealed_by_another_account_is_refused_even_with_a_valid_seal(tmp_path, monkeypatch):
    d = saving_run_dir(tmp_path)
    monkeypatch.setenv("DDPLAB_KEY_FILE", str(tmp_path / "classmate.key"))
    (checkpoint_dir(d) / ".metadata").write_bytes(b"anything")
    seal.sign(d, checkpoint_dir(d))    # a classmate's lab seals what it wrote, under its own key
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"checkpoint\.seal\.json was not made with this account's checkpoint key"):
        resume_of(d)


@pytest.mark.parametrize("text", ["", "[]", '{"files": [], "hmac": 1}', "[" * 100000])
def test_a_missing_or_damaged_seal_is_refused(tmp_path, text):
    d = saving_run_dir(tmp_path)
    seal.seal_file(d).write_text(text)
    with pytest.raises(ValueError, match=r"Experiment\.task\.resume_from: .*is not a ddplab checkpoint seal"):
        resume_of(d)
    seal.seal_file(d).unlink()
    with pytest.raises(ValueError, match=r"checkpoint\.seal\.json is missing: this checkpoint was not sealed"):
        resume_of(d)


def test_a_checkpoint_moved_into_another_run_is_refused_with_its_seal(tmp_path):
    """The seal covers the saving run's spec.json: a 4-rank run's checkpoint and seal moved into a 2-rank
    run's directory (each rank would restore another world's streams and positions) is refused."""
    two, four = saving_run_dir(tmp_path / "a"), saving_run_dir(tmp_path / "b", world_size=4)
    shutil.rmtree(checkpoint_dir(two))
    shutil.copytree(checkpoint_dir(four), checkpoint_dir(two))
    shutil.copy(seal.seal_file(four), seal.seal_file(two))
    with pytest.raises(ValueError, match=r"spec\.json \(changed\)"):
        resume_of(two)


def test_a_resume_is_never_written_over_the_run_it_resumes_from(tmp_path):
    d = saving_run_dir(tmp_path)
    for out in (d, tmp_path):
        with pytest.raises(ValueError, match=r"out: .* holds the saving run .* checkpoint included"):
            ddplab.run(resume_of(d), out=out)
    assert (checkpoint_dir(d) / ".metadata").exists() and not list(tmp_path.glob(".*partial"))


def test_a_finished_resume_is_read_without_its_saving_run(tmp_path):
    """Reading a record checks the spec's own fields only: the saving run may have moved since."""
    text = resume_of(saving_run_dir(tmp_path)).to_json()
    shutil.rmtree(tmp_path / "saved")
    with pytest.raises(ValueError, match=r"task\.resume_from: .* is not a run directory"):
        Experiment.from_json(text)
    with reading_a_record():
        assert Experiment.from_json(text).task.resume_from == str(tmp_path / "saved")


def test_a_symbolic_link_in_the_checkpoint_is_refused(tmp_path):
    d = saving_run_dir(tmp_path)
    (checkpoint_dir(d) / "__1_0.distcp").symlink_to("/etc/hostname")
    with pytest.raises(ValueError, match=r"__1_0\.distcp is a symbolic link"):
        seal.verify(d, checkpoint_dir(d))


def test_a_damaged_key_is_refused_naming_it(tmp_path, monkeypatch):
    d = saving_run_dir(tmp_path)
    monkeypatch.setenv("DDPLAB_KEY_FILE", str(tmp_path / "bad.key"))
    (tmp_path / "bad.key").write_text("not a key")
    (tmp_path / "bad.key").chmod(0o600)
    with pytest.raises(ValueError, match=r"bad\.key is not a ddplab checkpoint key"):
        seal.verify(d, checkpoint_dir(d))


# ---- a spec never imports the module it names ---------------------------------------------------------
EVIL = "ddplab_evilmod_for_tests"


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    """A module on sys.path that writes a marker file when imported."""
    marker = tmp_path / "imported"
    (tmp_path / f"{EVIL}.py").write_text(f"open({str(marker)!r}, 'w').write('code ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def _evil_spec() -> str:
    d = json.loads(Experiment(**MODEL).to_json())
    d["task"] = {"kind": "zz", "module": EVIL}
    return json.dumps(d)


def test_a_spec_naming_a_module_is_refused_without_importing_it(evil_module):
    with pytest.raises(ValueError, match=rf"Experiment\.task: kind 'zz' is declared in module '{EVIL}', which is "
                                         rf"not imported; ddplab never imports a module that a file names"):
        Experiment.from_json(_evil_spec())
    assert EVIL not in sys.modules and not evil_module.exists()


def test_loading_a_run_directory_whose_spec_names_a_module_imports_nothing(tmp_path, evil_module):
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.json").write_text(_evil_spec())
    with pytest.raises(ValueError, match=rf"declared in module '{EVIL}', which is not imported"):
        load_run(run)
    assert EVIL not in sys.modules and not evil_module.exists()


@pytest.mark.parametrize("task", [{"kind": ["x"], "module": EVIL}, {"kind": "zz", "module": ["x"]}])
def test_a_task_section_of_the_wrong_types_is_a_value_error(task):
    d = json.loads(Experiment(**MODEL).to_json())
    d["task"] = task
    with pytest.raises(ValueError, match=r"Experiment\.task: must be one of"):
        Experiment.from_json(json.dumps(d))


def test_the_command_line_imports_a_task_module_only_when_asked(tmp_path):
    """In a fresh interpreter (nothing imported yet): a spec of tests/support/toy_task.py's task is refused, and
    accepted with --import tests.support.toy_task."""
    from tests.support.toy_task import Toy

    spec = tmp_path / "spec.json"
    spec.write_text(Experiment(task=Toy(), world_size=2).to_json())
    code = ("import sys; from ddplab.cli import build_parser; from ddplab.cli.flags import experiment_for; "
            "print(experiment_for(build_parser().parse_args(sys.argv[1:])).task.kind)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    refused = subprocess.run([sys.executable, "-c", code, "run", "--spec", str(spec)], capture_output=True,
                             text=True, cwd=ROOT, env=env)
    assert refused.returncode != 0 and "ddplab run --import tests.support.toy_task" in refused.stderr
    ok = subprocess.run([sys.executable, "-c", code, "run", "--import", "tests.support.toy_task", "--spec", str(spec)],
                        capture_output=True, text=True, cwd=ROOT, env=env)
    assert ok.returncode == 0 and ok.stdout.strip() == "toy", ok.stderr
    without = subprocess.run([sys.executable, "-c", code, "run", "--import", "tests.support.toy_task"], capture_output=True,
                             text=True, cwd=ROOT, env=env)
    assert without.returncode != 0 and "--import tests.support.toy_task: imports the module of a task that a --spec file " \
                                       "names; without --spec" in without.stderr, without.stderr


def test_a_key_others_can_read_is_refused(tmp_path, monkeypatch):
    key = tmp_path / "shared.key"
    monkeypatch.setenv("DDPLAB_KEY_FILE", str(key))
    d = saving_run_dir(tmp_path)
    key.chmod(0o644)
    with pytest.raises(ValueError, match=r"must belong to this account and be readable by it alone"):
        seal.verify(d, checkpoint_dir(d))


def test_the_tests_seal_with_a_key_of_this_pytest_run_never_the_accounts():
    # tests/conftest.py sets it before any xdist worker starts, so workers, ranks and notebook kernels share it
    assert Path(os.environ["DDPLAB_KEY_FILE"]).parent.name.startswith("ddplab-test-key-")
