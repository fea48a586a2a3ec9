"""A model whose forward gives no parameter a gradient trains nothing: `ddplab run` refuses it before
launching, as `ddplab audit` does, with the one check both share (launch/preflight.py), instead of
reporting a complete run whose parameters never moved."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ddplab
from ddplab import Experiment, cli

DDPLAB = shutil.which("ddplab") or str(Path(sys.executable).parent / "ddplab")
ROOT = Path(__file__).resolve().parents[2]
DETACHED = "tests.support.gradient_models:detached_output"
SAYS = "forward gives no trainable parameter a gradient"


def test_ddplab_run_refuses_a_model_that_receives_no_gradient_before_launching(tmp_path):
    out = subprocess.run([DDPLAB, "run", "--model", DETACHED, "--world-size", "2", "--steps", "2", "--out",
                          str(tmp_path / "r")], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert f"ddplab run: Experiment.model: {DETACHED}'s {SAYS}: one forward and backward on two examples left " \
           f"all 4 without one" in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()   # nothing launched, no run directory


def test_a_loss_with_no_graph_at_all_is_the_same_refusal(tmp_path, monkeypatch):
    (tmp_path / "nograph.py").write_text(
        "import torch.nn as nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self, vocab_size, d_model):\n"
        "        super().__init__()\n"
        "        self.emb, self.head = nn.Embedding(vocab_size, d_model), nn.Linear(d_model, vocab_size)\n"
        "    def forward(self, idx):\n"
        "        return self.head(self.emb(idx)).detach()\n"
        "def model(vocab_size, d_model):\n"
        "    return M(vocab_size, d_model)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"Experiment.model: nograph:model's {SAYS}: .* left all 3 without one"):
        ddplab.run(Experiment(model="nograph:model", world_size=2, steps=1), tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("find_unused", [False, True])
def test_the_audit_and_run_share_the_check_and_find_unused_parameters_does_not_lift_it(find_unused, tmp_path,
                                                                                       capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["audit", "--model", DETACHED, "--world-size", "2", "--out", str(tmp_path / "a")]) == 2
    assert f"ddplab audit: Experiment.model: {DETACHED}'s {SAYS}" in capsys.readouterr().err
    code = cli.main(["run", "--model", DETACHED, "--world-size", "2", "--find-unused-parameters",
                     str(find_unused).lower(), "--out", str(tmp_path / "r")])
    assert code == 2 and SAYS in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "r").exists()
