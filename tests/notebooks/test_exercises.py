"""The exercise through nbgrader: the committed learner notebook is what
`nbgrader generate_assignment` makes of the instructor's source, the reference solution scores full
marks under `nbgrader autograde`, and the blank learner notebook scores nothing, each test failing
with one helpful line (no traceback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTOR = ROOT / "exercises" / "instructor"
NOTEBOOK = "data_parallel_exercise.ipynb"
ASSIGNMENT = "exercise"
PIECES = ("batch", "memory", "gradients", "readiness", "buckets", "comm")


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # alembic
    env.pop("DDPLAB_RUNS", None)
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                          text=True, timeout=900)


def sources(path: Path) -> list[tuple[str, str]]:
    nb = json.loads(path.read_text())
    return [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    shutil.copytree(INSTRUCTOR, course, dirs_exist_ok=True)
    done = nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    assert done.returncode == 0, done.stderr[-3000:]
    for student, nb in (("reference", course / "source" / ASSIGNMENT / NOTEBOOK),
                        ("blank", course / "release" / ASSIGNMENT / NOTEBOOK)):
        (course / "submitted" / student / ASSIGNMENT).mkdir(parents=True)
        shutil.copy(nb, course / "submitted" / student / ASSIGNMENT / NOTEBOOK)
    done = nbgrader(course, "autograde", ASSIGNMENT, "--force")
    assert done.returncode == 0, done.stderr[-3000:]
    return course


def grades(course: Path, student: str) -> dict[str, tuple[float, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="ddplab") as gb:
        sub = gb.find_submission(ASSIGNMENT, student)
        return {g.cell.name: (g.auto_score, g.max_score) for nb in sub.notebooks for g in nb.grades}


def errors(course: Path, student: str) -> dict[str, list[dict]]:
    nb = json.loads((course / "autograded" / student / ASSIGNMENT / NOTEBOOK).read_text())
    return {c["metadata"]["nbgrader"]["grade_id"]: [o for o in c["outputs"] if o["output_type"] == "error"]
            for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")}


def test_the_learners_notebook_is_what_nbgrader_generates(course):
    committed = ROOT / "exercises" / NOTEBOOK
    assert sources(committed) == sources(course / "release" / ASSIGNMENT / NOTEBOOK), \
        f"exercises/{NOTEBOOK} is stale: regenerate it (exercises/README.md)"
    text = committed.read_text()
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text and "evidence[\"memory\"] = {}" not in text


def test_the_reference_solution_scores_full_marks(course):
    scores = grades(course, "reference")
    assert {f"test_{p}" for p in PIECES} <= set(scores)
    assert all(got == full and full > 0 for got, full in scores.values()), scores
    assert not any(errors(course, "reference").values())


def test_the_blank_notebook_fails_every_test_with_one_helpful_line(course):
    scores = grades(course, "blank")
    assert all(got == 0 for got, _ in scores.values()), scores
    for grade_id, errs in errors(course, "blank").items():
        piece = grade_id.removeprefix("test_")
        assert len(errs) == 1 and errs[0]["ename"] == "EvidenceFailed", (grade_id, errs)
        assert errs[0]["evalue"].startswith(f"{piece}: not filled in yet"), errs[0]["evalue"]
        assert len(errs[0]["traceback"]) == 1, errs[0]["traceback"]   # one line, no traceback into ddplab
