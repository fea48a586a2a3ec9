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
    ("ddplab/processes.py", "from . import rundir", "the process rules import no torch and no other stage"),
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


# ---- names: one name per concept (docs/layout.md, "One name per concept") ----------------------------
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


MAX_MODULE_LINES = 330   # A module a newcomer can read in one sitting


def test_no_module_is_longer_than_a_sitting():
    long = {dotted: n for path, dotted in _modules() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def flat_view_calls(text: str) -> list[str]:
    """`tables.<function>`, `plots.<function>` or `widgets.<function>` where the function's module is
    not named (a function of one of the stage's modules, called on the stage itself): the notebooks
    reach every view as `<stage>.<module>.<function>`."""
    import importlib
    import inspect
    import pkgutil
    import re

    import ddplab.plots
    import ddplab.tables
    import ddplab.widgets

    functions = {}
    for stage in (ddplab.tables, ddplab.plots, ddplab.widgets):
        modules = [importlib.import_module(f"{stage.__name__}.{m.name}") for m in pkgutil.iter_modules(stage.__path__)]
        functions[stage.__name__.rsplit(".", 1)[1]] = {n for m in modules for n, f in vars(m).items()
                                                       if inspect.isfunction(f) and not n.startswith("_")} \
            - {m.__name__.rsplit(".", 1)[1] for m in modules}
    return [m.group(0) for m in re.finditer(r"(?<![\w.])(tables|plots|widgets)\.(\w+)\b(?!\.)", text)
            if m.group(2) in functions[m.group(1)]]


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


# ---- names at every stage: recipes, views, the CLI and the tests ------------------------------------------
# A module is named after a chapter (notebooks/NN_<name>.ipynb), a task (spec/<name>.py, record/<name>.py,
# rank/tasks/<name>.py) or one concept of this vocabulary, the one name it goes by at every stage.
CONCEPTS = {
    "buckets": "DDP's gradient buckets: their plan, their all-reduces, their overlap with backward",
    "comm": "what a collective sends and how long it takes (the all-reduce's alpha-beta cost)",
    "memory": "bytes a rank holds: parameters, gradients, optimizer state, activations",
    "gradients": "a rank's local, reduced and global-batch gradients, against one process's reference",
    "readiness": "when each parameter's gradient becomes ready in backward, and in what order",
    "ranks": "one row per rank of a run: its batch, its loss, its times",
    "traces": "the profiler's per-rank chrome traces and the timelines read off them",
    "stats": "medians, spreads and the slowest rank of repeated timings",
    "pipeline_timing": "one pipeline step on the host's clock: each stage's ops and the step's bubble",
    "reads": "which runs a view reads, and what makes them",
    "canvas": "the figures' shared drawing: sizes, colours, legends",
    "measuring": "a widget that launches a measurement and shows it as it arrives",
    "loss_weights": "how each rank's loss is weighted so the reduced gradient is the global batch's",
    "zero": "ZeRO's sharding of optimizer state, gradients and parameters over ranks",
    "failures": "a failure provoked on purpose and its diagnosis: which rank, where, why (chapter 08)",
    "profile": "the profile probe: torch.profiler's trace and memory timeline on every rank",
    "evidence": "what a learner writes down in the exercise, piece by piece, that ddplab.exercise checks",
    "plan": "a model planned at a cluster's world size on one CPU: what a rank holds and issues (a fake process group)",
}
PARTS = {   # modules named after their part of a stage rather than a task, chapter or concept, each with its meaning
    "launch": {
        "cells": "the launcher's side of a `%%ddp` cell: the cell as a job, every rank's output back",
        "cold": "the cold launch: torchrun started afresh for a run (`run`, `run_many`)",
        "diagnosis": "which experiment of a launch went wrong first, and why, read from what the ranks left",
        "keeper": "the one process between the launcher and torchrun, that no process of the run outlives",
        "loopback": "torchrun with every rendezvous socket bound to loopback",
        "nodes": "where a launch's ranks run: one node, several simulated on this host, or SLURM's",
        "preflight": "what cannot run here, refused before any process starts",
        "progress": "a running launch's progress bars, one per rank",
        "provoked": "the launcher's side of `failures`: launch a failure on purpose and time its diagnosis",
        "reuse": "whether a launch reuses warm ranks, starts a session or goes cold",
        "script": "a user's own torchrun script, started the way the lab starts its ranks",
        "session": "a session of warm ranks: torchrun once, every run that fits a job for them",
        "slurm": "a SLURM batch script for an experiment (`ddplab slurm`)",
        "torchrun": "the torchrun process tree: its command, its environment, killing it",
        "watch": "following a launch from its ranks' files, and what they left when it ends",
    },
    "exercise": {
        "batch": "the exercise's first piece of evidence: the global-batch equation",
        "report": "what a check says: a finding per check, the report, the one-line error nbgrader raises",
        "shape": "a learner's evidence read into its documented structure, or the malformed field named",
    },
    "tools": {
        "audit": "`ddplab audit`: one launch on a practitioner's model, and what DDP did with it",
        "bucket_tuning": "`ddplab tune-buckets`: notebook 05's worked example on a practitioner's model",
        "compiled": "`--compile` for both tools: the model under torch.compile beside eager",
        "factory": "what both tools do before launching: the model factory named, checked and counted",
    },
}
CLI_GROUPS = {   # a CLI module holds a command group, or fronts the package of the same name
    "commands": "`ddplab run`, `slurm`, `doctor` and `lab`: the lab's own commands",
    "flags": "the flags every command that runs an experiment shares",
    "plan": "`ddplab plan`: the planner's command (launch/plan.py)",
}
TEST_STAGES = {   # tests/<folder>: the ddplab folders whose modules name its test modules
    "exercise": ["exercise"], "guard": ["guard"], "launch": ["launch"], "predict": ["predict"],
    "rank": ["rank", "rank/parallel", "rank/probes", "rank/tasks"], "record": ["record"], "spec": ["spec"],
    "tasks": ["rank/tasks"], "tools": ["tools", "cli"], "views": ["tables", "plots", "widgets"], "notebooks": [],
}
CLAIM_TESTS = {   # test modules named after a claim that spans modules, each with its reason
    "tests/test_architecture.py": "the import contracts, the size of a sitting and one name per concept hold",
    "tests/test_citations.py": "every path the repository cites is in the repository",
    "tests/test_gpu.py": "the GPU path: backend choice everywhere, real CUDA runs where there is CUDA",
    "tests/guard/test_guard_faults.py": "the guard against faults in a user's own script, watcher and hooks together",
    "tests/guard/test_guard_runs.py": "the guard in a plain torchrun script: every silent bug caught on every rank",
    "tests/launch/test_cleanup.py": "what a killed launcher or session leaves on disk is deleted once provably dead",
    "tests/launch/test_launch_argv.py": "the torchrun command line a launch builds (cold, torchrun, preflight)",
    "tests/launch/test_multinode.py": "several nodes meeting at one rendezvous (nodes, keeper, torchrun)",
    "tests/launch/test_nccl_diagnosis.py": "an NCCL hang diagnosed by rank from what NCCL's watchdog leaves",
    "tests/launch/test_orphans.py": "no orphans whenever the launcher dies or is interrupted",
    "tests/launch/test_owned_processes.py": "no process a run starts outlives its owner, whatever started it",
    "tests/launch/test_parent_check.py": "a rank checks its parent is torchrun's agent before it imports torch",
    "tests/launch/test_run_dirs.py": "runs never destroy runs: a launch replaces a run directory only when complete",
    "tests/launch/test_runs.py": "real torchrun runs end to end: results per rank, failures diagnosed",
    "tests/launch/test_session_policy.py": "when `run` starts a session of warm ranks by itself",
    "tests/launch/test_shared_launch.py": "the tests' one shared launch fails only the key a broken experiment is under",
    "tests/notebooks/test_browser.py": "the notebooks' widgets in a real JupyterLab",
    "tests/notebooks/test_exercises.py": "the exercise through nbgrader, as an instructor runs it",
    "tests/notebooks/test_notebook_cells.py": "what every notebook cell promises the learner",
    "tests/rank/test_replicas.py": "after every synchronized step the replicas agree, or the run fails naming why",
    "tests/rank/test_task_protocol.py": "adding a task is one module and one registration",
    "tests/spec/test_late_refusals.py": "bad input is refused naming the field before anything trains",
    "tests/spec/test_spec_fuzz.py": "any spec is refused naming a field, or round-trips through JSON exactly",
    "tests/tasks/test_bucket_claims.py": "notebook 05's timing claims judged on paired steps",
    "tests/tasks/test_chapter_timing_claims.py": "notebook 03's timing claims judged on synthetic runs",
    "tests/tools/test_no_gradient.py": "a model that gives no parameter a gradient is refused by `run` and `audit` alike",
    "tests/tools/test_own_model.py": "a practitioner's own model through the factory contract and both tools",
    "tests/views/test_global_batch_plot.py": "notebook 06's batch-size figure shows every step its runs ran",
    "tests/views/test_key_checks.py": "the notebooks' most important checks can fail",
    "tests/views/test_readiness_and_bucket_plots.py": "notebooks 04 and 05's figures keep every mark visible",
    "tests/views/test_results_errors.py": "asking a run for what it did not record says what it lacks",
    "tests/views/test_widget_labels.py": "notebook 01's sliders show their whole labels",
    "tests/views/test_wrong_run.py": "the results API on a run it is not for says so",
}


def chapters(root: Path = ROOT) -> set[str]:
    return {p.stem.split("_", 1)[1] for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb")}


def task_modules() -> set[str]:
    import ddplab.spec  # noqa: F401 (registers ddplab's tasks)
    from ddplab.spec.tasks import _REGISTRY

    return {cls.__module__.rsplit(".", 1)[-1] for cls in _REGISTRY.values() if cls.__module__.startswith("ddplab.")}


def module_names(folder: Path) -> list[str]:
    """The modules and subpackages of a package folder, by name (not __init__ or __main__)."""
    return sorted({p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")}
                  | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()})


def unnamed_modules(names, *vocabularies) -> list[str]:
    return [n for n in names if not any(n in v for v in vocabularies)]


def unnamed_tests(tests_root: Path, package: Path, named: set[str], claims) -> list[str]:
    """tests/<folder>/test_<name>.py whose <name> is no module of the folders its stage tests (TEST_STAGES),
    no module at ddplab's top level, no package (`test_record.py`), no name in `named`, and no listed claim."""
    top = set(module_names(package))
    found = []
    for path in sorted(tests_root.glob("*/test_*.py")):
        folder, name = path.parent.name, path.stem.removeprefix("test_")
        stages = TEST_STAGES.get(folder)
        if stages is None:
            found.append(f"{folder}/{path.name}: tests/{folder} is no stage")
            continue
        own = {n for s in stages for n in module_names(package / s)} | {s.rsplit("/", 1)[-1] for s in stages}
        if name not in own | top | named and f"tests/{folder}/{path.name}" not in claims:
            found.append(f"{folder}/{path.name}")
    return found


def unnamed_top_tests(tests_root: Path, package: Path, claims) -> list[str]:
    """tests/test_<name>.py whose <name> is no module at ddplab's top level and that is no listed claim."""
    top = set(module_names(package))
    return [p.name for p in sorted(tests_root.glob("test_*.py"))
            if p.stem.removeprefix("test_") not in top and f"tests/{p.name}" not in claims]


def test_every_recipe_module_is_named_after_a_chapter_or_a_task():
    assert unnamed_modules(module_names(PACKAGE / "recipes"), chapters(), task_modules(), CONCEPTS) == []


@pytest.mark.parametrize("stage", ["predict", "tables", "plots", "widgets"])
def test_every_view_and_model_module_is_named_after_a_task_a_chapter_or_a_concept(stage):
    assert unnamed_modules(module_names(PACKAGE / stage), chapters(), task_modules(), CONCEPTS) == []


@pytest.mark.parametrize("stage", sorted(PARTS))
def test_every_launcher_exercise_and_tool_module_is_named_after_a_task_a_chapter_a_concept_or_its_part(stage):
    assert unnamed_modules(module_names(PACKAGE / stage), chapters(), task_modules(), CONCEPTS, PARTS[stage]) == []
    assert set(PARTS[stage]) <= set(module_names(PACKAGE / stage)), "a listed part is gone: unlist it"


def test_every_cli_module_holds_a_command_group_or_fronts_its_package():
    """`cli/tools.py` fronts `ddplab/tools/` (`ddplab audit`, `ddplab tune-buckets`): one concept, one name."""
    assert unnamed_modules(module_names(PACKAGE / "cli"), CLI_GROUPS, module_names(PACKAGE)) == []


def test_every_test_module_is_named_after_what_it_tests():
    named = chapters() | task_modules() | set(CONCEPTS) | {"exercises", "self_tests", "claims", "verify", "cli"}
    assert unnamed_tests(ROOT / "tests", PACKAGE, named, CLAIM_TESTS) == []
    assert unnamed_top_tests(ROOT / "tests", PACKAGE, CLAIM_TESTS) == []
    assert all((ROOT / t).exists() for t in CLAIM_TESTS), "a listed claim test is gone: unlist it"


def test_the_stage_name_checks_see_what_they_forbid(tmp_path):
    # the names this layout had before one concept got one name
    assert unnamed_modules(["slowest_rank", "failure_lab", "stragglers", "compression"], chapters(), task_modules(),
                           CONCEPTS) == ["slowest_rank", "failure_lab"]
    assert "comm_hooks" not in task_modules() and "compression" in task_modules()
    launch = ["provoked", "failure_lab", "report"]   # report is the exercise's part, not the launcher's
    assert unnamed_modules(launch, CONCEPTS, PARTS["launch"]) == ["failure_lab", "report"]
    package = tmp_path / "ddplab"
    (package / "predict").mkdir(parents=True)
    (package / "predict" / "buckets.py").write_text("")
    (package / "results.py").write_text("")
    for name in ("test_schedule", "test_buckets", "test_results", "test_overlap", "test_claimed"):
        (tmp_path / "tests" / "predict").mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / "predict" / f"{name}.py").write_text("")
    (tmp_path / "tests" / "misc").mkdir()
    (tmp_path / "tests" / "misc" / "test_buckets.py").write_text("")
    file = "{}/test_{}.py".format   # built, not written out: these files exist only in tmp_path
    assert unnamed_tests(tmp_path / "tests", package, set(), {"tests/" + file("predict", "claimed"): "a claim"}) == \
        [file("misc", "buckets") + ": tests/misc is no stage", file("predict", "overlap"), file("predict", "schedule")]
    for name in ("results", "issue_52", "claimed"):
        (tmp_path / "tests" / f"test_{name}.py").write_text("")
    claimed = "tests/test_{}.py".format("claimed")   # built, not written out, as above
    assert unnamed_top_tests(tmp_path / "tests", package, {claimed: "a claim"}) == ["test_issue_52.py"]
