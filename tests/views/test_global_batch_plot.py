"""The batch-size figure of notebook 06: every curve spans the steps its run ran."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

from ddplab import Experiment, plots


def fake_run(global_batch, examples=1024):
    steps = examples // global_batch
    spec = Experiment(world_size=2, local_batch=global_batch // 2, steps=steps)
    return SimpleNamespace(spec=spec, global_loss=lambda: [4.0 - i / steps for i in range(steps)],
                           step_ms=lambda warmup=0: [10.0] * (steps - warmup))


def test_every_curve_of_the_batch_size_study_reaches_its_last_step():
    runs = [fake_run(8), fake_run(32)]
    fig = plots.global_batch.batch_size_study(runs, target_loss=1.5)
    by_examples, by_steps = fig.axes
    lines = [line for line in by_steps.get_lines() if line.get_label().startswith("global batch")]
    assert [max(line.get_xdata()) for line in lines] == [128, 32]   # batch 8 ran 128 steps, batch 32 ran 32
    assert by_steps.get_xlim()[1] >= 128                            # and the axis shows all of them
    assert [max(line.get_xdata()) for line in by_examples.get_lines() if line.get_label().startswith("global")] == [1024] * 2
