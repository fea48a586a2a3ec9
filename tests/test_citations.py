"""Every path the repository cites exists: a reader can follow each one.

Scanned: the package, the tests, the benchmarks and the exercises (.py), the notebooks and exercises
(markdown and code cells, not outputs), docs/*.md, README.md, bench/README.md, exercises/README.md, the
root conftest.py, .ci/run and pyproject.toml. A citation is
- a repository path: `docs/...md`, `ddplab/...py`, `tests/...py`, `notebooks/...ipynb`, `bench/...`,
  `exercises/...`, `.ci/run`; and a bare module path such as `record/balance.py` or
  `rank/tasks/train.py`, which resolves under ddplab/;
- a relative link in markdown (a .md file or a notebook's markdown cell), `[text](deaths.md)` or
  `[text](../bench/README.md)`: it resolves from the folder of the file that holds it;
- a section of our docs, `docs/x.md, "Heading"` (several: `"A", "B" and "C"`): the file has that heading;
- a torch source file, `torch/...py`: it is in the running torch's package, so this test also says, on
  each torch release, whether the internals docs/ddp-internals.md cites are still where it says;
- anything under notes/, or "notes, section N": always a failure (those files are not in the repository;
  what the lab relies on is in docs/).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH_ROOT = Path(importlib.util.find_spec("torch").submodule_search_locations[0]).parent

SCANNED = ("ddplab/**/*.py", "tests/**/*.py", "bench/*.py", "exercises/**/*.py", "notebooks/*.ipynb",
           "exercises/**/*.ipynb", "docs/*.md", "README.md", "bench/README.md", "exercises/README.md",
           "conftest.py", ".ci/run", "pyproject.toml")
# The only files not scanned, and why.
NOT_SCANNED = {
    "tests/test_citations.py": "its self-check holds made-up citations on purpose",
}
# Paths that are cited but are not in the repository on purpose, and why.
NOT_IN_REPOSITORY = {
    # none yet
}

_EDGE = r"(?<![\w./-])"   # a citation starts a path: not the tail of a longer path or a URL
REPO_PATH = re.compile(_EDGE + r"((?:docs|ddplab|tests|notebooks)/[\w./-]*?\.(?:md|py|ipynb)"
                       r"|(?:bench|exercises)/[\w./-]*\w|\.ci/run)(?![\w*{])")
BARE_MODULE = re.compile(_EDGE + r"((?:[a-z_]\w*/)+\w+\.py)\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")   # a markdown link's target, without its #anchor
TORCH_SOURCE = re.compile(_EDGE + r"(torch/[\w./]*?\.pyi?)\b")
NOTES = re.compile(r"\bnotes/[\w.-]*\w|\bnotes, sections?\b|\bnotes: ")
SECTION = re.compile(r"(docs/[\w.-]+\.md)`?,\s+((?:\"[^\"\n]+\"(?:,\s*|\s+and\s+)?)+)")
TOP_LEVEL = ("docs", "ddplab", "tests", "bench", "notebooks", "exercises", "torch")


def headings(doc: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in doc.read_text().splitlines() if line.startswith("#")}


def missing_citations(text: str, root: Path = ROOT, torch_root: Path = TORCH_ROOT) -> list[str]:
    """The citations in `text` that cannot be followed, each with why."""
    out = [f"{m.group(0)!r}: notes/ is not in the repository; cite docs/" for m in NOTES.finditer(text)]
    for m in REPO_PATH.finditer(text):
        path = m.group(1).rstrip(".")
        if path not in NOT_IN_REPOSITORY and not (root / path).exists():
            out.append(f"{path}: not in the repository")
    for m in BARE_MODULE.finditer(text):
        path = m.group(1)
        if path.split("/")[0] not in TOP_LEVEL and not (root / "ddplab" / path).exists():
            out.append(f"{path}: not in ddplab/")
    for m in TORCH_SOURCE.finditer(text):
        if not (torch_root / m.group(1)).is_file():
            out.append(f"{m.group(1)}: not in the installed torch ({torch_root / 'torch'})")
    for m in SECTION.finditer(text):
        doc = root / m.group(1)
        if doc.is_file():
            have = headings(doc)
            out += [f"{m.group(1)}: no section {h!r}" for h in re.findall(r"\"([^\"\n]+)\"", m.group(2))
                    if h not in have]
    return out


def missing_links(markdown: str, folder: Path, root: Path = ROOT) -> list[str]:
    """The relative links in `markdown` (a file in `folder`) whose target is not in the repository."""
    out = []
    for m in LINK.finditer(markdown):
        target = m.group(1)
        if re.match(r"(?:https?|mailto):", target):
            continue
        path = (folder / target).resolve()
        if not path.exists() or not path.is_relative_to(root.resolve()):
            out.append(f"]({target}): not in the repository (from {folder.relative_to(root).as_posix() or '.'}/)")
    return out


def cited_text(path: Path, cell_types=("markdown", "code")) -> str:
    """What a reader reads in the file: a notebook's markdown and code cells, or the whole file."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] in cell_types)


def markdown_text(path: Path) -> str:
    """The markdown of a file: all of a .md file, a notebook's markdown cells, nothing of anything else."""
    if path.suffix == ".md":
        return path.read_text()
    return cited_text(path, ("markdown",)) if path.suffix == ".ipynb" else ""


def scanned_files() -> list[Path]:
    files = {p for pattern in SCANNED for p in ROOT.glob(pattern) if p.is_file()}
    return sorted(p for p in files if p.relative_to(ROOT).as_posix() not in NOT_SCANNED)


def test_every_cited_path_section_and_torch_source_exists():
    files = scanned_files()
    assert len(files) > 100, f"the scan found only {len(files)} files: the patterns no longer match the tree"
    failures = [f"{p.relative_to(ROOT)}: {why}" for p in files
                for why in missing_citations(cited_text(p)) + missing_links(markdown_text(p), p.parent)]
    assert not failures, "citations a reader cannot follow:\n" + "\n".join(failures)


def test_the_scanner_reports_what_it_forbids():
    made_up = missing_citations('see docs/made-up-page.md and ddplab/no_such_module.py, record/no_such.py,\n'
                                'rank/tasks/no_such.py, rank/tasks/no_such2.py, rank/tasks/train.py,\n'
                                'torch/nn/parallel/no_such.py, notes/ddp-internals.md, section 2 (notes, section 0)\n'
                                '(notes: performance anchors) and docs/ddp-internals.md, "Buckets" and "No such heading"')
    assert made_up == [
        "'notes/ddp-internals.md': notes/ is not in the repository; cite docs/",
        "'notes, section': notes/ is not in the repository; cite docs/",
        "'notes: ': notes/ is not in the repository; cite docs/",
        "docs/made-up-page.md: not in the repository",
        "ddplab/no_such_module.py: not in the repository",
        "record/no_such.py: not in ddplab/",
        "rank/tasks/no_such.py: not in ddplab/",
        "rank/tasks/no_such2.py: not in ddplab/",
        f"torch/nn/parallel/no_such.py: not in the installed torch ({TORCH_ROOT / 'torch'})",
        "docs/ddp-internals.md: no section 'No such heading'",
    ]


def test_the_scanner_accepts_real_citations_and_ignores_urls():
    assert missing_citations('docs/ddp-internals.md, "Buckets", "The bucket rebuild" and "Clocks"; '
                             "ddplab/units.py, rank/clock.py, tests/test_citations.py, .ci/run, "
                             "torch/nn/parallel/distributed.py, https://github.com/NVIDIA/nccl-tests/blob/"
                             "master/doc/PERFORMANCE.md, https://example.org/notebooks/x.ipynb") == []


def test_notebook_outputs_are_not_read_as_citations(tmp_path):
    nb = tmp_path / "n.ipynb"
    nb.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["see docs/a.md"]},
        {"cell_type": "code", "source": ["x = 1"], "outputs": [{"text": "docs/printed-at-run-time.md"}]}]}))
    assert cited_text(nb) == "see docs/a.md\nx = 1"


def test_the_link_check_reports_what_it_forbids_and_follows_real_links():
    docs = ROOT / "docs"
    assert missing_links("[a](deaths.md), [b](../bench/README.md#targets), [c](no_such.md), [d](../../etc/passwd),\n"
                         "[e](https://example.org/x.md), [f](mailto:a@b.c), [g](#a-heading), [h](../no/such.py)",
                         docs) == ["](no_such.md): not in the repository (from docs/)",
                                   "](../../etc/passwd): not in the repository (from docs/)",
                                   "](../no/such.py): not in the repository (from docs/)"]


def test_only_markdown_is_read_for_links(tmp_path):
    nb = tmp_path / "n.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": ["[a](x.md)"]},
                                        {"cell_type": "code", "source": ["fns[0](x)"], "outputs": []}]}))
    (tmp_path / "f.py").write_text("fns[0](x)")
    assert markdown_text(nb) == "[a](x.md)" and markdown_text(tmp_path / "f.py") == ""
