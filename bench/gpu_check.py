"""Verify ddplab's GPU path on whatever GPUs this machine has, in at most 6 minutes: one line per check.

    python bench/gpu_check.py            # PASS / FAIL / SKIP per check, then a summary; exit 1 if any failed
    python bench/gpu_check.py --json out.json

Without CUDA it says so and exits 0 (nothing to check). With G GPUs it runs, each as real torchrun ranks:

- nccl: DDP on NCCL with one GPU per rank (G ranks, at most 8): replicas agree, the update matches the
  single-process reference, each rank on its own device;
- gloo-cuda: two gloo ranks sharing one GPU (CUDA tensors, gloo's host staging);
- cuda-events: the step's phases timed with CUDA events, and the bucket and ready times taken on the
  device (`rank/clock.GpuStamps`): in order inside backward;
- memory-ledger: the memory probe's ledger against `torch.cuda.memory_allocated` at every phase and the
  allocator's peak, plus a memory snapshot;
- allreduce-busbw: an all-reduce sweep on NCCL, bus bandwidth in the nccl-tests convention
  (algbw x 2(n-1)/n), needs 2 GPUs;
- nccl-bytes: what the ranks sent, from the buckets they launched and from the profiler's NCCL records,
  against the ring formula;
- nccl-hang: a rank that skips its backward on NCCL, diagnosed as a hang naming it (2 GPUs);
- doctor: `ddplab doctor`'s all-reduce, over NCCL too where each rank has a GPU;
- chapter-01, 02, 04, 05: the key checks of those notebooks on CUDA (NCCL where there are GPUs
  enough, else gloo ranks sharing the GPUs).

Each check is independent: one that fails prints why and the rest go on. Checks still waiting when
the 6-minute budget is spent are skipped, and say so.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

BUDGET_S = 360.0
CHECKS: list = []


def check(name: str, needs_gpus: int = 1):
    def register(fn):
        CHECKS.append((name, needs_gpus, fn))
        return fn
    return register


class Skip(Exception):
    """A check that cannot run here (too few GPUs): not a failure."""


def _place(world_size: int, gpus: int) -> dict:
    """NCCL with one GPU per rank where there are enough, else gloo ranks sharing the GPUs."""
    return dict(backend="nccl", device="cuda") if gpus >= world_size else dict(backend="gloo", device="cuda")


def _run(exp, out: Path):
    import ddplab

    return ddplab.run(exp, out / f"{exp.name}-{exp.hash}", progress=False, warm=False)


@check("nccl")
def nccl_ranks(gpus: int, out: Path) -> str:
    import ddplab

    w = min(gpus, 8)
    run = _run(ddplab.Experiment(name="gpu-nccl", world_size=w, backend="nccl", steps=3,
                                 probes=("reference", "buckets", "readiness")), out)
    devices = [r.device for r in run.ranks]
    assert all(r.backend == "nccl" for r in run.ranks) and len(set(devices)) == w, devices
    assert len({r.param_checksum.final for r in run.ranks}) == 1, "replicas differ"
    worst = max(r.reference.ddp.update_rel_error for r in run.ranks)
    assert worst < 1e-5, f"update off the single-process reference by {worst:.2e}"
    _LAST["nccl"] = run
    return f"{w} NCCL ranks on {', '.join(devices)}; update matches the reference within {worst:.1e}"


@check("gloo-cuda")
def gloo_cuda(gpus: int, out: Path) -> str:
    import ddplab

    run = _run(ddplab.Experiment(name="gpu-gloo", world_size=2, backend="gloo", device="cuda", steps=2,
                                 probes=("reference",)), out)
    assert all(r.backend == "gloo" and r.device.startswith("cuda") for r in run.ranks)
    assert len({r.param_checksum.final for r in run.ranks}) == 1, "replicas differ"
    worst = max(r.reference.ddp.update_rel_error for r in run.ranks)
    assert worst < 1e-5, f"update off the reference by {worst:.2e}"
    return f"2 gloo ranks on {run.ranks[0].device}; update within {worst:.1e} of the reference"


@check("cuda-events")
def cuda_events(gpus: int, out: Path) -> str:
    run = _LAST.get("nccl")
    if run is None:
        raise Skip("needs the nccl check's run")
    lines = []
    for r in run.ranks:
        for s in r.steps:
            assert s.step_ms > 0, "a step timed at 0 ms"
        st = r.steps[-1]
        b = st.backward
        assert b.ready and b.start_ns <= b.ready[0].t_ns and b.ready[-1].t_ns <= b.end_ns, "ready times outside backward"
        for bucket in st.buckets:
            assert bucket.launch_ns <= bucket.done_ns, f"bucket {bucket.index} done before it launched"
            assert bucket.done_ns <= b.end_ns + 1_000_000, f"bucket {bucket.index} done after backward returned"
        lines.append(f"rank {r.rank}: backward {(b.end_ns - b.start_ns) / 1e6:.2f} ms, "
                     f"last bucket done {(max(x.done_ns for x in st.buckets) - b.start_ns) / 1e6:.2f} ms in")
    return "; ".join(lines)


@check("memory-ledger")
def memory_ledger(gpus: int, out: Path) -> str:
    import ddplab
    from ddplab import tables

    exp = ddplab.Experiment(name="gpu-memory", world_size=1, backend="nccl", steps=2, optimizer="adam",
                            probes=("memory", "memory-snapshot"))
    run = _run(exp, out)
    table = tables.memory.memory_cuda(run)
    gap = (table["cuda_allocated"] - table["ledger"]).min()
    assert gap >= -1e-3, f"the ledger counts more than the allocator holds (by {-gap:.3f} MiB)"
    peak_gap = table["cuda_peak_allocated"].max() - table["ledger_peak"].max()
    assert peak_gap >= -1e-3, f"the ledger's step peak exceeds max_memory_allocated by {-peak_gap:.3f} MiB"
    snapshot = run.path / "rank0.memory.pickle"
    assert snapshot.exists() and snapshot.stat().st_size > 0, "no memory snapshot"
    spread = (table["cuda_allocated"] - table["ledger"]).max()
    return (f"{len(table)} phases: allocated minus ledger {gap:.2f}..{spread:.2f} MiB, peak allocated minus the "
            f"ledger's peak {peak_gap:.2f} MiB; snapshot {snapshot.stat().st_size / 1e6:.1f} MB")


@check("allreduce-busbw", needs_gpus=2)
def allreduce_busbw(gpus: int, out: Path) -> str:
    from ddplab import recipes, tables

    w = min(gpus, 8)
    run = _run(recipes.allreduce_sweep(w, min_bytes=1 << 20, max_bytes=1 << 28, repeats=20, backend="nccl",
                                       name=f"gpu-allreduce-w{w}"), out)
    sweep = tables.comm.allreduce_sweep(run)
    print(sweep[["ms", "algbw_gb_s", "busbw_gb_s"]].round(3).to_string())
    big = sweep["busbw_gb_s"].iloc[-1]
    assert big > sweep["busbw_gb_s"].iloc[0], "bus bandwidth does not grow with the message"
    return f"{w} GPUs: busbw {big:.1f} GB/s at {sweep.index[-1] / 2 ** 20:.0f} MiB (nccl-tests convention)"


@check("nccl-bytes")
def nccl_bytes(gpus: int, out: Path) -> str:
    import ddplab
    from ddplab.predict import comm

    w = min(gpus, 8)
    run = _run(ddplab.Experiment(name="gpu-bytes", world_size=w, backend="nccl", steps=2, bucket_cap_mb=0.25,
                                 probes=("buckets", "profile")), out)
    r0 = run.ranks[0]
    payload = sum(b.bytes for b in r0.steps[-1].buckets)
    assert payload == r0.result.model.gradient_bytes, (payload, r0.result.model.gradient_bytes)
    traced = _nccl_allreduce_bytes(run.path)
    assert len(traced) == w, f"the profiler recorded all-reduces on {len(traced)} of {w} ranks"
    for name, total in traced.items():   # the profiled step(s): a whole number of gradients, nothing else
        assert total % payload == 0, f"{name}: the profiler's all-reduce records carry {total} B, the buckets {payload}"
    assert len(set(traced.values())) == 1, f"the ranks' profiles disagree: {traced}"
    steps = next(iter(traced.values())) // payload
    assert steps <= run.spec.steps, f"the profiler counts {steps} gradients in {run.spec.steps} steps: double counting"
    per_rank = comm.ring_bytes_per_rank(payload, w)
    return (f"buckets {payload / 2 ** 20:.2f} MiB a step = the gradient = what the profiler's all_reduce records "
            f"carried ({sorted(set(traced.values()))} B); the ring sends {per_rank / 2 ** 20:.2f} MiB per rank "
            f"(2(n-1)/n = {2 * (w - 1) / w:.2f} of it) on {w} ranks")


def _nccl_allreduce_bytes(run_dir: Path) -> dict:
    """From each rank's profiler trace: bytes of the communication library's all_reduce records
    (nccl:all_reduce; gloo:all_reduce in a dry run on the CPU), from their message size or input shape."""
    import math

    sizes = {"float": 4, "Float": 4, "double": 8, "Double": 8, "c10::Half": 2, "Half": 2, "c10::BFloat16": 2,
             "BFloat16": 2}
    out = {}
    for trace in sorted(Path(run_dir).rglob("*.pt.trace.json")):
        try:
            events = json.loads(trace.read_text()).get("traceEvents", [])
        except (ValueError, AttributeError):
            continue
        total = 0
        for e in events:
            args = e.get("args", {})
            if not str(e.get("name", "")).endswith(":all_reduce"):
                continue
            kind = str((args.get("Input type") or ["float"])[0] if "Input type" in args else args.get("dtype", "float"))
            if "In msg nelems" in args:
                total += int(args["In msg nelems"]) * sizes.get(kind, 4)
            elif args.get("Input Dims"):
                total += math.prod(args["Input Dims"][0]) * sizes.get(kind, 4)
        if total:
            out[trace.name] = total
    return out


@check("nccl-hang", needs_gpus=2)
def nccl_hang(gpus: int, out: Path) -> str:
    import ddplab
    from ddplab.spec import Fault

    try:
        _run(ddplab.Experiment(name="gpu-hang", world_size=2, backend="nccl", steps=2, timeout_s=10,
                               fault=Fault("skip-backward", rank=1, step=1)), out)
    except ddplab.RunFailed as e:
        d = e.diagnosis
        assert d.kind == "hang" and d.ranks == [1], f"{d.kind} {d.ranks}: {d.summary}"
        return d.summary[:300]
    raise AssertionError("the skipped backward did not fail the run")


@check("doctor")
def doctor_check(gpus: int, out: Path) -> str:
    from ddplab.doctor import check

    said: list[str] = []
    assert check(said.append), "\n".join(said)
    return " / ".join(line.strip() for line in said[-3:])


@check("chapter-01")
def chapter_01(gpus: int, out: Path) -> str:
    from ddplab import recipes, tables

    exp = recipes.gradient_run(world_size=2, **_place(2, gpus), name="gpu-ch01")
    run = _run(exp, out)
    tables.gradients.verify_global_batch_gradient(tables.gradients.gradient_check(run))
    return f"{exp.backend} on CUDA: every rank holds the global-batch gradient"


@check("chapter-02")
def chapter_02(gpus: int, out: Path) -> str:
    from ddplab import recipes, tables

    exp = recipes.memory_ledger(world_size=2, **_place(2, gpus), name="gpu-ch02")
    tables.memory.verify_model_state(tables.memory.memory_table(_run(exp, out)))
    return f"{exp.backend} on CUDA: parameters, gradients, buckets, Adam state as predicted"


@check("chapter-04")
def chapter_04(gpus: int, out: Path) -> str:
    import ddplab
    from ddplab import recipes, tables

    exps = [e.replace(**_place(e.world_size, gpus)) for e in recipes.backward_trace(steps=4)]
    runs = ddplab.run_many(exps, out / "gpu-ch04", progress=False, warm=False)
    ddp_run = next(r for r in runs if r.spec.sync == "ddp")
    tail = tables.readiness.dependency_tail(ddp_run)
    assert tail["holds_last_ready"].all(), tail
    assert (tail["launch_after_last_ready_ms"] >= 0).all(), tail["launch_after_last_ready_ms"].tolist()
    return (f"{exps[0].backend} on CUDA: the last bucket holds the last gradient and launches after it "
            f"({tail['launch_after_last_ready_ms'].round(3).tolist()} ms)")


@check("chapter-05")
def chapter_05(gpus: int, out: Path) -> str:
    import ddplab
    from ddplab import recipes
    from ddplab.tables import bucket_sweep, buckets

    place = _place(2, gpus)
    exps = [e.replace(**place, pin_cpus=False) for e in recipes.bucket_sweep(caps_mb=(0.25, 1, 4), rounds=1, steps=2,
                                                                              allreduce_repeats=5)]
    runs = {r.spec.name: r for r in ddplab.run_many(exps, out / "gpu-ch05", progress=False, warm=False)}
    sweep = runs["bucket-sweep-w2"]
    ins = bucket_sweep.inputs(sweep)
    measured = bucket_sweep.measured(sweep)
    plans = [p for p in measured.index if p.startswith("ddp:") and p != "ddp:default"]
    wrong = [p for p in plans if buckets.plan_for(sweep, p, ins) != buckets.ddp_rule(ins, bucket_sweep.cap_of(p))]
    assert not wrong, f"DDP's buckets differ from the rule at {wrong}"
    return f"{place['backend']} on CUDA: DDP's buckets are the rule on the ready order at {', '.join(plans)}"


_LAST: dict = {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="stop starting checks after this long")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("SKIP gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to check")
        return 0
    gpus = torch.cuda.device_count()
    print(f"gpu_check: {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    t0, results = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="ddplab-gpu-check-") as tmp:
        for name, needs, fn in CHECKS:
            started = time.monotonic()
            if started - t0 > args.budget_s:
                status, detail = "SKIP", f"the {args.budget_s:.0f} s budget is spent"
            elif gpus < needs:
                status, detail = "SKIP", f"needs {needs} GPUs, this machine has {gpus}"
            else:
                try:
                    status, detail = "PASS", fn(gpus, Path(tmp))
                except Skip as e:
                    status, detail = "SKIP", str(e)
                except Exception as e:   # noqa: BLE001 - one failing check must not stop the others
                    status, detail = "FAIL", f"{type(e).__name__}: {e}"
                    traceback.print_exc(limit=3)
            seconds = time.monotonic() - started
            print(f"{status} {name} ({seconds:.1f} s): {detail}", flush=True)
            results.append({"check": name, "status": status, "seconds": round(seconds, 1), "detail": detail})
    failed = [r["check"] for r in results if r["status"] == "FAIL"]
    print(f"gpu_check: {sum(r['status'] == 'PASS' for r in results)} passed, {len(failed)} failed, "
          f"{sum(r['status'] == 'SKIP' for r in results)} skipped in {time.monotonic() - t0:.0f} s"
          + (f" (failed: {', '.join(failed)})" if failed else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"gpus": gpus, "results": results}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
