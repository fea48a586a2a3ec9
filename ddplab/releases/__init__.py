"""Which torch releases the lab is verified on, and the facts about torch's internals that differ
between them, each read from the running torch.

The lab teaches torch's own mechanisms, so what it says about them can change with a release. Each
`Fact` here pairs a probe (`probes.py`: a small function that asks the running torch, never a remembered
answer) with what it answered on each verified release (`expected`). `VERIFIED` is what CI checks (the
whole suite on each). `ddplab doctor` prints the running release and every fact that
behaves differently from the newest verified release; the tests (`tests/test_releases.py`) fail when a
fact on the running torch is not what it was on its release, or, on a newer release, what it was on the
newest verified one. docs/torch-versions.md says what each fact means for a learner.
Used by `ddplab doctor`, `import ddplab` (the oldest release) and notebook 08.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .probes import (analyzer_evaluates_rank_lists, batched_powersgd_takes_one_matrix, dcp_metadata_format,
                     ddp_bucket_caps_mib, ddp_bucket_rule, ddp_buffer_sync_setting, ddp_takes_bucket_cap_mb_list,
                     gloo_dump_group_table, gloo_flight_record_states, local_group_name_counts, optimize_ddp_modes,
                     schedules_refusing_fewer_microbatches_than_stages)

VERIFIED = ("2.13.0", "2.14.1")   # the releases CI runs the whole suite on (.ci/run)
OLDEST = VERIFIED[0]


def release(version: str) -> tuple[int, ...]:
    """"2.14.1+cu130" -> (2, 14, 1); "2.15.0a0" -> (2, 15, 0): the release, without its build labels."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not found:
        raise ValueError(f"torch version {version!r}: expected major.minor[.patch]")
    return tuple(int(n or 0) for n in found.groups())


def installed_torch() -> str | None:
    """The torch release that `import torch` would load here, without importing it: its package's own
    `torch/version.py`, else its installed metadata (None: no torch)."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    spec = find_spec("torch")
    if spec is not None and spec.origin:
        written = Path(spec.origin).with_name("version.py")
        said = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", written.read_text(), re.M) \
            if written.is_file() else None
        if said:
            return said.group(1)
    try:
        return version("torch") if spec is not None else None
    except PackageNotFoundError:
        return None


def require_supported(found: str | None) -> None:
    """ImportError, said plainly, when torch is missing or older than the oldest verified release: a
    lesson would otherwise stop at a traceback from deep inside torch."""
    fix = f"pip install 'torch>={OLDEST}' (verified: {', '.join(VERIFIED)})"
    if found is None:
        raise ImportError(f"ddplab needs torch, which is not installed here: {fix}")
    if release(found) < release(OLDEST):
        raise ImportError(f"ddplab needs torch >= {OLDEST}; this environment has torch {found}: {fix}")


@dataclass(frozen=True)
class Fact:
    name: str
    says: str                       # what the probe answers, for a learner
    probe: Callable[[], object]
    expected: dict                  # verified release -> the probe's answer there
    plain: dict | None = None       # answer -> the sentence a notebook prints (else `says: answer`)


FACTS = (
    Fact("analyzer_evaluates_rank_lists",
         "torch's flight-recorder analyzer runs a dump's rank list as Python (eval)",
         analyzer_evaluates_rank_lists, {"2.13.0": True, "2.14.1": False},
         {True: "its flight-recorder analyzer runs a dump's rank list as Python (eval): a dump can run code",
          False: "its flight-recorder analyzer reads a dump's rank list as a literal (ast.literal_eval), "
                 "never as code"}),
    Fact("gloo_flight_record_states", "a gloo rank's flight-record entries after two all-reduces are in states",
         gloo_flight_record_states, {v: ("scheduled",) for v in VERIFIED},
         {("scheduled",): "gloo records every collective in its flight recorder, by default, and every entry "
                          "stays 'scheduled' (gloo never marks one started or completed)",
          (): "gloo records nothing in the flight recorder by default"}),
    Fact("gloo_dump_group_table", "a gloo rank's dump's group table, once a second group exists, is",
         gloo_dump_group_table, {"2.13.0": {"": "[]"}, "2.14.1": {"": "[0]"}}),
    Fact("local_group_name_counts",
         "a group made with use_local_synchronization is named after how many",
         local_group_name_counts, {"2.13.0": "groups held", "2.14.1": "groups made"}),
    Fact("ddp_bucket_caps_mib", "DDP's default bucket caps in MiB (first bucket, the others)",
         ddp_bucket_caps_mib, {"2.13.0": (1.0, 25.0), "2.14.1": (1.0, 25.0)}),
    Fact("ddp_bucket_rule", "torch's bucket assignment of six 1 KiB tensors under caps of 2 and 3 KiB",
         ddp_bucket_rule, {"2.13.0": [[0, 1], [2, 3, 4], [5]], "2.14.1": [[0, 1], [2, 3, 4], [5]]}),
    Fact("ddp_takes_bucket_cap_mb_list", "DDP takes one cap per bucket (bucket_cap_mb_list)",
         ddp_takes_bucket_cap_mb_list, {"2.13.0": True, "2.14.1": True}),
    Fact("optimize_ddp_modes", "torch.compile's DDP modes (the default's meaning, all of them)",
         optimize_ddp_modes,
         {v: ("ddp_optimizer", ("ddp_optimizer", "python_reducer", "python_reducer_without_compiled_forward",
                                "no_optimization")) for v in VERIFIED}),
    Fact("ddp_buffer_sync_setting", "DDP's setting that syncs buffers before each forward is named",
         ddp_buffer_sync_setting, {"2.13.0": "forward_sync_buffers", "2.14.1": "forward_sync_buffers"}),
    Fact("batched_powersgd_takes_one_matrix", "PowerSGD's orthogonalization takes the batched hook's 2-D matrix",
         batched_powersgd_takes_one_matrix, {"2.13.0": False, "2.14.1": False}),
    Fact("schedules_refusing_fewer_microbatches_than_stages",
         "torch's pipeline schedules that refuse fewer microbatches than stages",
         schedules_refusing_fewer_microbatches_than_stages, {v: ("Schedule1F1B",) for v in VERIFIED}),
    Fact("dcp_metadata_format", "a distributed checkpoint's .metadata file is written as",
         dcp_metadata_format, {"2.13.0": "pickle", "2.14.1": "pickle"}),
)


def _named(name: str) -> Fact:
    found = [f for f in FACTS if f.name == name]
    if not found:
        raise ValueError(f"no fact named {name!r}; the facts: {', '.join(f.name for f in FACTS)}")
    return found[0]


def fact(name: str):
    """The running torch's answer to the fact called `name` (a probe that fails raises: tests want that)."""
    return _named(name).probe()


@dataclass(frozen=True)
class Unanswered:
    """A probe that raised: the torch it asked lacks what it asks about, or the process holds a group."""
    error: str

    def __repr__(self) -> str:
        return f"could not ask ({self.error})"


def ask(f: Fact):
    """The probe's answer, or `Unanswered` where it raised: doctor and a notebook say so, not a traceback."""
    try:
        return f.probe()
    except Exception as e:  # noqa: BLE001 - an unverified release may lack any private name a probe reads
        return Unanswered(f"{type(e).__name__}: {e}")


def tell(name: str) -> str:
    """The fact called `name` on the running torch, in one plain sentence."""
    import torch

    f = _named(name)
    answer = ask(f)
    if isinstance(answer, Unanswered):
        said = f"{f.says}: {answer!r}"
    else:
        said = f.plain[answer] if f.plain and answer in f.plain else f"{f.says}: {answer!r}"
    return f"torch {torch.__version__}: {said}"


def baseline(found: str) -> str:
    """The verified release whose answers the running torch should give: its own where it is verified,
    else the newest verified release older than it (or the oldest, for an older one)."""
    older = [v for v in VERIFIED if release(v) <= release(found)]
    return older[-1] if older else OLDEST


@dataclass(frozen=True)
class Answer:
    fact: Fact
    seen: object
    expected: object    # on `baseline`'s release

    @property
    def differs(self) -> bool:
        return self.seen != self.expected


def answers(found: str) -> list[Answer]:
    """Every fact on the running torch beside what it was on `baseline(found)`."""
    base = baseline(found)
    return [Answer(f, ask(f), f.expected[base]) for f in FACTS]


def report(found: str) -> list[str]:
    """`ddplab doctor`'s lines about the running release: verified or not, and each fact that differs from
    a verified release (from `baseline`; the others, where this is a verified release)."""
    base = baseline(found)
    verified = release(found) in {release(v) for v in VERIFIED}
    lines = [f"torch {found}: " + ("verified (CI runs the whole suite on it)" if verified else
                                   f"not verified (CI checks {', '.join(VERIFIED)}); compared with {base}")]
    for a in answers(found):
        others = {v: e for v, e in a.fact.expected.items() if e != a.seen}
        if a.differs:
            lines.append(f"  DIFFERS from {base}: {a.fact.says}: {a.seen!r} here, {a.expected!r} on {base}")
        elif others:
            lines.append(f"  {a.fact.says}: {a.seen!r} here (as on {base}; "
                         + ", ".join(f"{e!r} on {v}" for v, e in others.items()) + ")")
    return lines
