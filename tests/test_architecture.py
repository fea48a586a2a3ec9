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
    ("ddplab/rank/probes/memory.py", "from ..parallel.ddp import wrap_in_ddp", "inside a rank: the meters import no parallel"),
    ("ddplab/guard/hooks.py", "from ..launch import cold", "the guard runs in a user's own script"),
    ("ddplab/guard/checks.py", "import torch", "the guard's verdicts are pure"),
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


# ---- names: one name per concept (README, "Layout") -----------------------------------------------------
PACKAGE = ROOT / "ddplab"


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ".".join(path.relative_to(ROOT).with_suffix("").parts)


def function_named_like_its_module(path: Path) -> list[str]:
    import ast

    return [n.name for n in ast.parse(path.read_text()).body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == path.stem]


def module_renaming_imports(path: Path, dotted: str) -> list[str]:
    """`from <ddplab package> import <module> as <other name>` and `import ddplab.<module> as <other>`."""
    import ast

    package = dotted.rsplit(".", 1)[0] if path.stem != "__init__" else dotted
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("ddplab"):
                continue
            folder = ROOT.joinpath(*source.split("."))
            for a in node.names:
                if a.asname and a.asname != a.name and (folder / f"{a.name}.py").exists() or \
                        a.asname and a.asname != a.name and (folder / a.name / "__init__.py").exists():
                    found.append(f"from {source} import {a.name} as {a.asname}")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name} as {a.asname}" for a in node.names
                      if a.name.startswith("ddplab.") and a.asname and a.asname != a.name.rsplit(".", 1)[-1]]
    return found


def test_no_function_is_named_like_its_module():
    """A package that re-exports such a function hides its own module (`tables.memory` was the function,
    not the module)."""
    named = [f"{dotted}.{n}" for path, dotted in _modules() for n in function_named_like_its_module(path)]
    assert named == []


def test_no_import_renames_a_ddplab_module():
    """`from ..predict import buckets as simulator` made one module go by two names; a module that clashes
    with a name of the importer is reached through its stage (`predict.buckets.simulate`)."""
    renamed = [f"{dotted}: {line}" for path, dotted in _modules() for line in module_renaming_imports(path, dotted)]
    assert renamed == []


def test_the_name_checks_see_what_they_forbid(tmp_path):
    shadow = tmp_path / "memory.py"
    shadow.write_text("def memory(run):\n    return run\n")
    assert function_named_like_its_module(shadow) == ["memory"]
    alias = tmp_path / "buckets.py"
    alias.write_text("from ..predict import buckets as simulator\nfrom ..predict.buckets import simulate as run\n")
    assert module_renaming_imports(alias, "ddplab.tables.buckets") == \
        ["from ddplab.predict import buckets as simulator"]   # a function alias is not a module's second name


def test_every_task_goes_by_one_module_name_through_every_stage():
    """A task's settings, record, rank code and recipes share one module name: spec/<m>.py,
    record/<m>.py, rank/tasks/<m>.py."""
    import ddplab.spec  # noqa: F401 (registers ddplab's tasks)
    from ddplab.spec.tasks import _REGISTRY

    for kind, cls in _REGISTRY.items():
        if not cls.__module__.startswith("ddplab."):
            continue
        name = cls.__module__.rsplit(".", 1)[-1]
        assert cls.__module__ == f"ddplab.spec.{name}", kind
        assert cls.record.__module__ == f"ddplab.record.{name}", kind
        assert cls.runner == f"ddplab.rank.tasks.{name}:run", kind


MAX_MODULE_LINES = 330   # issue 31: a module a newcomer can read in one sitting


def test_no_module_is_longer_than_a_sitting():
    long = {dotted: n for path, dotted in _modules() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def flat_view_calls(text: str) -> list[str]:
    """`tables.<function>`, `plots.<function>` or `widgets.<function>` where the function's module is
    not named: the notebooks reach every view as `<stage>.<module>.<function>`."""
    import inspect
    import re

    import ddplab.plots
    import ddplab.tables
    import ddplab.widgets

    stages = {"tables": ddplab.tables, "plots": ddplab.plots, "widgets": ddplab.widgets}
    return [m.group(0) for m in re.finditer(r"(?<![\w.])(tables|plots|widgets)\.(\w+)\b(?!\.)", text)
            if inspect.isfunction(getattr(stages[m.group(1)], m.group(2), None))]


def test_the_notebooks_call_every_view_through_its_module():
    import json

    found = {}
    for path in sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("exercises/**/*.ipynb")]):
        if ".ipynb_checkpoints" in path.parts:
            continue
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)
        if flat := flat_view_calls(text):
            found[path.name] = sorted(set(flat))
    assert found == {}
    assert flat_view_calls("t = tables.rank_table(run); tables.ranks.rank_table(run); plots.memory.memory_figure(r)") \
        == ["tables.rank_table"]   # the check sees what it forbids
