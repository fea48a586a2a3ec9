"""The guard's verdicts (pure, `ddplab/guard/checks.py`) and its fingerprints: each check fires on the
report of a broken loop and stays quiet on a healthy one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddplab.guard import checks
from ddplab.guard.fingerprint import batch_fingerprint, loss_reduction, tensor_fingerprint

STATIC = {"params": ["w", "b", "head.w"], "outside": [False, False, True], "buffers": ["bn.running_mean"],
          "buffer_owners": ["BatchNorm1d"], "ddp": True}


def healthy(world: int = 2) -> list[dict]:
    return [{"rank": r, "step": 7, "layout": "x", "batches": [[8, 100 + r, 5]], "grads": [[4, 1, 1], [2, 3, 3], [1, 5, 5]],
             "params": [[4, 9, 9], [2, 8, 8], [1, 7, 7]], "buffers": [[3, 2, 2]], "no_sync": False,
             "loss": {"value": 1.5, "reduction": "mean", "denominator": 8.0, "scale": 1.0}, "sampler": []}
            for r in range(world)]


def kinds(reports, static=STATIC) -> set[str]:
    return {p.kind for p in checks.find_problems(reports, static)}


def test_a_healthy_step_has_no_problem():
    assert kinds(healthy()) == set() and kinds(healthy(4)) == set()


def test_the_same_batch_on_two_of_four_ranks_names_those_two():
    reports = healthy(4)
    reports[3]["batches"] = [reports[1]["batches"][0]]
    (p,) = checks.find_problems(reports, STATIC)
    assert p.kind == "same-batch" and p.ranks == (1, 3) and "ranks 1 and 3 got the same batch" in p.message


def test_gradients_of_a_parameter_outside_ddp_are_named_with_the_fix():
    reports = healthy()
    reports[1]["grads"][2] = [1, 6, 6]
    reports[1]["params"][2] = [1, 0, 0]
    found = checks.find_problems(reports, STATIC)
    assert [p.kind for p in found] == ["unsynced-gradients", "replicas-differ"]
    assert "head.w" in found[0].message and "not among the parameters DDP averages" in found[0].message
    assert "they got different gradients" in found[1].message


def test_no_sync_left_on_is_named_as_the_cause():
    reports = healthy()
    reports[0]["grads"][0] = [4, 0, 0]
    for r in reports:
        r["no_sync"] = True
    (p,) = [p for p in checks.find_problems(reports, STATIC) if p.kind == "unsynced-gradients"]
    assert "no_sync" in p.message and "w" in p.message


def test_replicas_that_differ_with_equal_gradients_say_the_update_or_the_start_differs():
    reports = healthy()
    reports[1]["params"][0] = [4, 0, 0]
    (p,) = checks.find_problems(reports, STATIC)
    assert p.kind == "replicas-differ" and "the gradients agreed" in p.message


def test_buffers_that_differ_name_batchnorm_and_sync_batchnorm():
    reports = healthy()
    reports[1]["buffers"] = [[3, 0, 0]]
    (p,) = checks.find_problems(reports, STATIC)
    assert p.kind == "buffers-differ" and "bn.running_mean" in p.message and "SyncBatchNorm" in p.message


@pytest.mark.parametrize("losses, bad", [
    ([("mean", 8, 1.0), ("mean", 4, 1.0)], True),            # per-rank means of unequal batches
    ([("mean", 8, 0.5), ("mean", 4, 0.5)], True),            # the same, accumulated over 2 micro-batches
    ([("mean", 8, 8 / 6), ("mean", 4, 4 / 6)], False),       # each mean re-weighted by its share of the batch
    ([("sum", 8, 1 / 12), ("sum", 4, 1 / 12)], False),       # sums over the global count
    ([("mean", 8, 1.0), ("mean", 8, 1.0)], False),           # equal batches
    ([("mean", 8, 1.0), ("unknown", None, 1.0)], False),     # cannot tell: no alarm
])
def test_loss_weights_alarm_exactly_when_examples_weigh_differently(losses, bad):
    reports = healthy()
    for r, (reduction, denominator, scale) in zip(reports, losses):
        r["loss"] = {"value": 1.0, "reduction": reduction, "denominator": denominator, "scale": scale}
    assert ("loss-weights" in kinds(reports)) is bad


def test_the_loss_weights_message_gives_the_ratio_and_the_global_mean():
    reports = healthy()
    reports[0]["loss"] = {"value": 1.0, "reduction": "mean", "denominator": 8.0, "scale": 1.0}
    reports[1]["loss"] = {"value": 4.0, "reduction": "mean", "denominator": 4.0, "scale": 1.0}
    (p,) = checks.find_problems(reports, STATIC)
    # DDP: (1 + 4) / 2 = 2.5; over all 12: (8 * 1 + 4 * 4) / 12 = 2
    assert "counts 2.00x one of rank 0" in p.message and "is 2.5;" in p.message and "is 2. Fix" in p.message


def test_the_global_mean_adds_up_a_mean_and_a_sum_the_same_way():
    reports = healthy()
    reports[0]["loss"] = {"value": 1.0, "reduction": "mean", "denominator": 8.0, "scale": 1.0}   # 8 in all
    reports[1]["loss"] = {"value": 40.0, "reduction": "sum", "denominator": 4.0, "scale": 1.0}   # 40 in all
    (p,) = checks.find_problems(reports, STATIC)
    assert "the mean over all 12 is 4. Fix" in p.message, p.message


def test_examples_weighed_a_little_apart_are_a_note_and_beyond_five_percent_an_error():
    reports = healthy()
    for r, n in zip(reports, (100.0, 98.0)):   # a padded batch: 100 and 98 tokens counted
        r["loss"] = {"value": 1.0, "reduction": "mean", "denominator": n, "scale": 1.0}
    (p,) = checks.find_problems(reports, STATIC)
    assert (p.kind, p.severity) == ("loss-weights", "note") and "1.02x" in p.message
    reports[1]["loss"]["denominator"] = 90.0
    assert [p.severity for p in checks.find_problems(reports, STATIC)] == ["error"]


def test_a_repeated_epoch_order_is_an_error_and_padding_a_note():
    reports = healthy()
    for r in reports:
        r["sampler"] = [{"epoch": 0, "pass": 0, "n": 102, "first": True, "repeats": False, "padded": 1, "dropped": 0},
                        {"epoch": 0, "pass": 1, "n": 102, "first": False, "repeats": True, "padded": 0, "dropped": 0}]
    found = checks.find_problems(reports, STATIC)
    assert [(p.kind, p.severity) for p in found] == [("sampler-repeats", "error"), ("sampler-uneven", "note")]
    assert "set_epoch" in found[0].message and "1 example is read twice" in found[1].message


def test_models_that_differ_are_said_before_anything_is_compared():
    reports = healthy()
    reports[1]["layout"] = "y"
    reports[1]["params"] = [[1, 1, 1]]
    assert kinds(reports) == {"models-differ"}


# ---- fingerprints --------------------------------------------------------------------------------------
def test_a_fingerprint_is_exact_and_independent_of_the_thread_count():
    t = torch.randn(1_000_003)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tensor_fingerprint(t)
        torch.set_num_threads(max(2, threads))
        assert tensor_fingerprint(t.clone()) == one
    finally:
        torch.set_num_threads(threads)
    u = t.clone()
    u[500_000] = torch.nextafter(u[500_000], torch.tensor(float("inf")))   # one ulp
    assert tensor_fingerprint(u) != one
    assert tensor_fingerprint(t.double()) != one and tensor_fingerprint(t.bfloat16()) != one


def test_batch_fingerprints_see_every_tensor_in_args_and_kwargs():
    x, y = torch.arange(8), torch.arange(8) * 2
    assert batch_fingerprint((x,), {"labels": y}) == batch_fingerprint((x.clone(),), {"labels": y.clone()})
    assert batch_fingerprint((x,), {"labels": y}) != batch_fingerprint((x,), {"labels": y + 1})
    assert batch_fingerprint((), {"n": 3}) is None
    ids = torch.randint(0, 64, (8, 12))
    assert batch_fingerprint((ids,), {}) != batch_fingerprint((ids.flip(1),), {})   # same tokens, another order
    assert tensor_fingerprint(ids) == tensor_fingerprint(ids.flip(1).flip(1))
    mask = torch.tensor([True, False, True])   # 3 bytes: neither int32 nor int16 words
    assert tensor_fingerprint(mask) != tensor_fingerprint(~mask)


def test_the_loss_reduction_is_read_from_the_autograd_graph():
    logits = torch.randn(6, 3, requires_grad=True)
    target = torch.tensor([0, 1, -100, 2, 0, -100])
    n = torch.tensor(12.0)
    assert loss_reduction(F.cross_entropy(logits, target)) == ("mean", 4.0, 1.0)     # ignored targets left out
    assert loss_reduction(F.cross_entropy(logits, target) / 2) == ("mean", 4.0, 0.5)
    assert loss_reduction(F.cross_entropy(logits, target, reduction="sum") / n) == ("sum", 4.0, 1 / 12)
    assert loss_reduction(logits.mean() * 3) == ("mean", 18.0, 3.0)
    assert loss_reduction(logits.mean(dim=0).sum())[0] == "unknown"   # the mean's count is hidden inside
    assert loss_reduction(logits.max())[0] == "unknown"
    assert loss_reduction(logits.sum(dim=1).mean()) == ("mean", 6.0, 1.0)   # a sum per example, then the mean
    assert loss_reduction(logits.sum()) == ("sum", 18.0, 1.0)
    mask = torch.tensor([1.0, 1, 0, 1, 0, 1])
    assert loss_reduction((logits.sum(1) * mask).sum() / mask.sum()) == ("sum", 6.0, 0.25)   # a masked mean
    weighted = F.cross_entropy(logits, target.clamp(min=0), weight=torch.tensor([1.0, 2.0, 3.0]))
    assert loss_reduction(weighted)[:2] == ("mean", float(torch.tensor([1.0, 2, 3])[target.clamp(min=0)].sum()))


def test_a_watched_sampler_pickles_as_the_plain_sampler():
    import pickle
    from types import SimpleNamespace

    from torch.utils.data import DistributedSampler

    from ddplab.guard.sampler import watch

    guard = SimpleNamespace(sampler_events=[])
    sampler = DistributedSampler(range(10), num_replicas=2, rank=1, seed=3)
    validation = DistributedSampler(range(10), num_replicas=2, rank=1, shuffle=False)
    watch(sampler, guard)
    watch(validation, guard)
    for _ in range(2):   # two epochs, set_epoch never called, a validation pass after each
        list(sampler), list(validation)
    assert isinstance(sampler, DistributedSampler) and not hasattr(sampler, "_ddplab_guard")
    assert [e["repeats"] for e in guard.sampler_events] == [False, False, True, False]   # each sampler on its own
    again = pickle.loads(pickle.dumps(sampler))
    assert type(again) is DistributedSampler and list(again) == list(sampler)
    with pytest.raises(ValueError, match="sampler: .* needs a length"):
        watch(iter(range(3)), guard)


@pytest.mark.parametrize("kwargs, field", [
    ({"model": 5}, "model"), ({"every": 0}, "every"), ({"every": 2.5}, "every"), ({"on_problem": "stop"}, "on_problem"),
    ({"timeout_s": float("inf")}, "timeout_s"), ({"timeout_s": 0}, "timeout_s"), ({"sampler": [1, 2]}, "sampler"),
    ({"optimizer": "adam"}, "optimizer"), ({}, "model: torch.distributed has no process group"),
])
def test_bad_arguments_are_refused_naming_the_field(kwargs, field):
    import ddplab.guard

    args = {"model": torch.nn.Linear(2, 2), **kwargs}
    with pytest.raises(ValueError, match=f"^{field}"):
        ddplab.guard.attach(args.pop("model"), **args)


@pytest.mark.parametrize("args, kwargs, field", [
    (("no_such_script.py",), {}, "script"), ((__file__,), {"world_size": 0}, "world_size"),
    ((__file__,), {"timeout_s": float("inf")}, "timeout_s"),
])
def test_run_script_refuses_bad_input_before_starting_anything(args, kwargs, field):
    import ddplab

    with pytest.raises(ValueError, match=f"^{field}"):
        ddplab.run_script(*args, **kwargs)


def test_a_parameter_registered_after_ddp_wrapped_the_model_is_blamed_on_that_not_on_a_hook():
    static = dict(STATIC, outside=[False, False, True], late=[False, False, True])
    reports = healthy()
    reports[1]["grads"][2] = [1, 6, 6]
    (p,) = [p for p in checks.find_problems(reports, static) if p.kind == "unsynced-gradients"]
    assert "head.w was registered on the model after DDP wrapped it" in p.message and "does not reduce" in p.message
    assert "a hook, clipping" not in p.message and "outside the DDP model" not in p.message
