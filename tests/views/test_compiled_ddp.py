"""The step figure of notebook 11: every bar shows its spread over the paired steps and says which,
and its axis names only the caps and modes it plots."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402

from ddplab import plots, tables  # noqa: E402

ARMS = ["compiled:default", "compiled:2"]


def step_table(arms=ARMS) -> pd.DataFrame:
    """A `tables.compiled_ddp.steps` table as notebook 11's run gave it, one row per arm."""
    row = {"eager_ms": 25.4, "compiled_ms": 24.6, "interval_ms": "[-10.6, +4.8]", "compiled faster?": "not resolved",
           "eager_q1_ms": 24.1, "eager_q3_ms": 27.0, "compiled_q1_ms": 23.2, "compiled_q3_ms": 25.8}
    return pd.DataFrame([row] * len(arms), index=pd.Index(arms, name="arm"))


def test_every_bar_has_whiskers_from_its_first_to_its_third_quartile():
    fig = plots.compiled_ddp.steps(step_table())
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [c.get_label() for c in bars] == ["eager", "compiled"]
    for c, kind in zip(bars, ("eager", "compiled")):
        assert c.errorbar is not None, f"{kind}'s bars have no whiskers"
        [whiskers] = c.errorbar.lines[2]
        ends = sorted(y for segment in whiskers.get_segments() for _, y in segment)
        assert ends == pytest.approx(sorted([24.1, 27.0] * 2 if kind == "eager" else [23.2, 25.8] * 2))
    assert "interquartile range of the paired steps" in fig.legends[0].get_title().get_text()
    assert all("not resolved" in t.get_text() and "[-10.6, +4.8] ms" in t.get_text() for t in ax.texts)


@pytest.mark.parametrize("arms, mode_named", [(ARMS, False), (["compiled:1/no_optimization"], True)])
def test_the_axis_names_only_the_caps_and_modes_plotted(arms, mode_named):
    ax = plots.compiled_ddp.steps(step_table(arms)).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [a.split(":", 1)[1].replace("/", "\n") for a in arms]
    assert ("optimize_ddp mode" in ax.get_xlabel()) == mode_named, ax.get_xlabel()


def test_the_step_table_holds_each_arms_quartiles():
    ms = {"eager:2": [20.0, 21.0, 22.0, 23.0, 24.0, 25.0, 26.0, 27.0, 28.0],
          "compiled:2": [30.0, 31.0, 32.0, 33.0, 34.0, 35.0, 36.0, 37.0, 38.0]}

    def arm(name):
        return SimpleNamespace(name=name, compiled=name.startswith("compiled"), mode="ddp_optimizer", cap_mb=2.0,
                               first_steps_s=[1.0], steps=[SimpleNamespace(step_ms=t) for t in ms[name]])
    rank = SimpleNamespace(result=SimpleNamespace(arms=[arm("eager:2"), arm("compiled:2")]))
    run = SimpleNamespace(spec=SimpleNamespace(name="compiled"), ranks=[SimpleNamespace(rank=r, **vars(rank))
                                                                        for r in (0, 1)])
    row = tables.compiled_ddp.steps(run).loc["compiled:2"]
    assert [row[f"{k}_q{q}_ms"] for k in ("eager", "compiled") for q in (1, 3)] == [22.0, 26.0, 32.0, 36.0]


def test_a_gradient_that_slips_ahead_of_the_others_is_one_move_not_all_of_them():
    from ddplab.tables.compiled_ddp import order_moves
    from ddplab.tables.stats import moves as _moved

    eager = [f"g{i}" for i in range(6)]
    assert _moved(eager, eager) == 0
    assert _moved(eager, ["g5", *eager[:5]]) == 1           # every position changed, one gradient moved
    assert _moved(eager, eager[::-1]) == 5                  # reversed: all but one must move
    assert _moved(eager, ["g1", "g0", "g3", "g2", "g4", "g5"]) == 2
    table = pd.DataFrame({"eager_position": range(6), "compiled_position": [1, 2, 3, 4, 5, 0],
                          "eager_ms": [1.0] * 6, "compiled_ms": [2.0] * 6}, index=eager)
    assert order_moves(table).startswith("1 of 6 gradients change place") and "compiled's g5" in order_moves(table)


def test_the_step_reading_counts_each_answer_and_the_compile_paid_up_front():
    from ddplab.tables.compiled_ddp import steps_reading

    table = pd.DataFrame({"compiled faster?": ["yes", "not resolved"], "first_step_s_compiled": [3.0, 2.5],
                          "first_step_s_eager": [0.5, 0.0]})
    assert steps_reading(table) == ("of 2 compiled arm(s): 1 faster, 1 not told apart from eager; compiling cost 5.0 s "
                                    "up front")
    assert "within this machine's noise" in steps_reading(table.assign(**{"compiled faster?": "not resolved"}))
