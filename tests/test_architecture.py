"""The layout's dependency rules (import-linter contracts in pyproject.toml) hold, and would fail if broken."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent)})


def broken_copy(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package and its contracts with one import added to `module`."""
    shutil.copytree(ROOT / "ddplab", tmp_path / "ddplab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{line}\n")
    return tmp_path


def test_the_import_contracts_hold():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    print(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module, line, contract", [
    ("ddplab/tables/ranks.py", "from ..launch import cold", "views never import the launcher or rank-side code"),
    ("ddplab/predict/comm.py", "import torch", "pure models import no torch"),
    ("ddplab/rank/tasks/train.py", "from ...tables import ranks", "rank-side code never imports views"),
    ("ddplab/spec/tasks.py", "from ..rank import models", "spec, record schema, units and checks import no torch"),
    ("ddplab/results.py", "from .rank import training", "the notebook's side never imports rank-side code"),
    ("ddplab/rank/parallel/bucketed.py", "from ..probes.buckets import BucketLog",
     "inside a rank: the parallel wrappers are mechanism only"),
    ("ddplab/rank/probes/memory.py", "from ..parallel.ddp import wrap", "inside a rank: the meters import no parallel"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    out = lint(broken_copy(tmp_path, module, line))
    assert out.returncode != 0, f"lint-imports passed although {module} does `{line}`"
    broken = [ln for ln in out.stdout.splitlines() if ln.startswith(contract) and "BROKEN" in ln]
    assert broken, out.stdout
    print(f"{module} + `{line}`: {broken[0]}")


def test_importing_ddplab_and_its_views_loads_no_torch():
    code = ("import sys, ddplab, ddplab.tables, ddplab.plots, ddplab.widgets, ddplab.recipes, ddplab.predict;"
            "from ddplab import recipes, Experiment;"
            "e = Experiment.from_json(recipes.bucket_sweep()[1].to_json());"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"torch was imported: {out.stdout.strip()[:200]}"
