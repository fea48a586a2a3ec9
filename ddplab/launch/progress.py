"""Show a running experiment's progress: one tqdm bar per rank while the ranks run (tqdm's notebook
bar in a notebook, its text bars stacked in a terminal), then one final line.

The launcher reads the ranks' progress logs (`rundir.ProgressLog`, through `launch/watch.py`) and
hands this module each rank's steps done and phase, and the slowest rank's line; nothing here talks
to the ranks. Where bars cannot be drawn (a widget's label, a notebook without ipywidgets) the line
stands in for them; a pipe or a CI log gets only the final line. Used by every notebook's launches
and by `ddplab run`.
"""

from __future__ import annotations

import sys

TEXT_BAR = "{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}{postfix}]"


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def describe(name: str, world_size: int, steps_done: list[int], steps: int, phase: str, elapsed_s: float,
             unit: str = "steps") -> str:
    """One line: how far the slowest rank is (`unit`: what the task counts, steps, rounds or repeats)."""
    slowest = min(steps_done) if steps_done else 0
    ranks = f"{len(steps_done)}/{world_size} ranks up" if len(steps_done) < world_size else f"{world_size} ranks"
    return f"ddplab {name}: {ranks}, {slowest}/{steps} {unit} done, slowest rank in '{phase}' ({elapsed_s:.1f} s)"


def bar_class(notebook: bool):
    """The tqdm class that draws here: `tqdm.auto`'s notebook bar in a notebook, the text bar in a
    terminal; None where tqdm cannot draw a notebook bar (no ipywidgets, a Qt console) or is missing."""
    import warnings

    try:
        if not notebook:
            from tqdm.std import tqdm
            return tqdm
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # tqdm warns that ipywidgets is missing: the line stands in
            from tqdm.auto import tqdm
            from tqdm.notebook import tqdm as notebook_tqdm
        return tqdm if issubclass(tqdm, notebook_tqdm) else None
    except ImportError:
        return None


class Reporter:
    """Per-rank bars while the ranks run (`watch`), one line otherwise (`update`); `finish` closes
    the bars and leaves the final line behind.

    `progress` is True (bars in a terminal or a notebook; only the final line in a pipe), False
    (silent), or a callable that gets every line and no bars: a widget's label, since an ipywidgets
    Output does not follow display-id updates, so a line shown inside one would freeze at its first state."""

    def __init__(self, progress=True):
        self.sink = progress if callable(progress) else None
        enabled = bool(progress)
        self.enabled = enabled
        self.notebook = enabled and self.sink is None and in_notebook()
        self.tty = enabled and self.sink is None and not self.notebook and sys.stderr.isatty()
        self._tqdm = bar_class(self.notebook) if self.notebook or self.tty else None
        self.bars: dict = {}          # rank -> its tqdm bar, for the experiment `_bars_for` indexes
        self._box = None              # in a notebook: one widget holding every rank's bar, shown once
        self._box_handle = None       # its display handle: the final line replaces the bars there
        self._bars_for: int | None = None
        self._bars_shown = False
        self._line_open = False       # a terminal line without its newline yet
        self._handle = None
        self._last = ""
        self.history: list[str] = []   # every distinct line shown, in order

    def _remember(self, line: str) -> bool:
        """Note a line; False if it is the one shown already (or the reporter is silent)."""
        if not self.enabled or line == self._last:
            return False
        self._last = line
        self.history.append(line)
        return True

    def update(self, line: str) -> None:
        if not self._remember(line):
            return
        if self.sink is not None:
            self.sink(line)
        elif self.bars:
            return   # the bars show the ranks now
        elif self.notebook:
            from IPython.display import Pretty, display

            if self._handle is None:
                self._handle = display(Pretty(line), display_id=True)
            else:
                self._handle.update(Pretty(line))
        elif self.tty:
            sys.stderr.write("\r\033[K" + line)
            sys.stderr.flush()
            self._line_open = True

    def watch(self, watch, elapsed_s: float) -> None:
        """Show where the launch is: a bar per rank of the experiment it is on, where bars draw, and
        the slowest rank's line (kept in `history`, handed to a callable, shown where no bars draw)."""
        line = watch.line(elapsed_s)
        if self._tqdm is not None:
            try:
                self._show_bars(watch)
            except Exception:   # a bar that cannot draw must not stop the launch: the line stands in
                self._tqdm = None
                self._close_bars()
            else:
                self._remember(line)
                return
        self.update(line)

    def _show_bars(self, watch) -> None:
        i, exp, ranks = watch.ranks()
        if self._bars_for is not None and i < self._bars_for:
            return   # a slow rank still finishing an earlier experiment: the bars only move forward
        if i != self._bars_for:
            self._reset_bars(i, exp, len(watch.runs))
        for r, (done, phase) in ranks.items():
            bar = self.bars[r]
            if (bar.n, bar.postfix) != (done, f"phase={phase}"):
                bar.n = done
                bar.set_postfix(phase=phase)   # redraws: n and elapsed with it

    def _reset_bars(self, i: int, exp, experiments: int) -> None:
        """Point the bars at experiment `i`: a rank it has keeps its bar, reset; a rank it lacks loses
        its bar; a rank new to it gets one."""
        if self.tty and self._line_open:   # keep the starting line above the bars
            sys.stderr.write("\n")
            self._line_open = False
        header = "" if experiments == 1 else f"{i + 1}/{experiments} {exp.name} "
        total, unit = exp.task.total_steps(exp), exp.task.step_unit
        for r in [r for r in self.bars if r >= exp.world_size]:
            bar = self.bars.pop(r)
            bar.leave = False   # clear its own line (a left bar would draw over rank 0's)
            bar.close()
        for r in range(exp.world_size):
            if r in self.bars:
                bar = self.bars[r]
                bar.unit = unit
                bar.set_description_str(f"{header}rank {r}", refresh=False)
                bar.set_postfix_str("", refresh=False)   # not the last experiment's phase
                bar.reset(total=total)
            else:
                # a terminal stacks the bars one line per rank, each bar as wide as the others whatever
                # its phase; a notebook bar lays itself out
                text = {"position": r, "bar_format": TEXT_BAR} if self.tty else {"display": False}
                self.bars[r] = self._tqdm(total=total, desc=f"{header}rank {r}", unit=unit, leave=True,
                                          file=sys.stderr, **text)
        if self.notebook:
            self._show_box()
        self._bars_for, self._bars_shown = i, True

    def _show_box(self) -> None:
        """A notebook's bars live in one box under the starting line's display id (the line on top), so
        that `finish` puts the final line in their place: a saved notebook keeps that one line, not the
        starting line frozen, a bar per rank, or an empty output."""
        if self._box is None:
            from IPython.display import display
            from ipywidgets import Label, VBox

            self._box = VBox((Label(self._last),))
            if self._handle is not None:
                self._handle.update(self._box)
                self._box_handle = self._handle
            else:
                self._box_handle = display(self._box, display_id=True)
        children = (self._box.children[0], *(self.bars[r].container for r in sorted(self.bars)))
        if self._box.children != children:
            self._box.children = children

    def _close_bars(self) -> None:
        """Close every bar in rank order (in a terminal each leaves its last state on its own line)."""
        bars, self.bars, self._bars_for = self.bars, {}, None
        for r in sorted(bars):
            try:
                bars[r].close()
            except Exception:
                pass

    def finish(self, line: str) -> None:
        if not self.enabled:
            return
        self._close_bars()
        if self.notebook or self.sink is not None:
            if self._box_handle is not None:
                self._handle = self._box_handle   # the final line takes the bars' place
                self._box = self._box_handle = None
            elif self._bars_shown:
                self._handle = None   # the final line goes below the bars, not up into the starting line
            self.update(line)
            return
        elif self.tty:
            sys.stderr.write("\r\033[K" + line + "\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
