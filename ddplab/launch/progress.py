"""Show a running experiment's progress: one live line in a terminal, an updating line in a notebook.

The launcher reads the ranks' progress logs (`rundir.ProgressLog`, through `launch/watch.py`) and
hands this module the slowest rank's position; nothing here talks to the ranks. Used by every
notebook's launches and by `ddplab run`.
"""

from __future__ import annotations

import sys


def _in_notebook() -> bool:
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


class Reporter:
    """Updates one line in place; `finish` leaves the final line behind.

    `progress` is True (a terminal's line, or a notebook output updated by display id), False
    (silent), or a callable that gets every line: a widget's label, since an ipywidgets Output
    does not follow display-id updates, so a line shown inside one would freeze at its first state."""

    def __init__(self, progress=True):
        self.sink = progress if callable(progress) else None
        enabled = bool(progress)
        self.enabled = enabled
        self.notebook = enabled and self.sink is None and _in_notebook()
        self.tty = enabled and self.sink is None and not self.notebook and sys.stderr.isatty()
        self._handle = None
        self._last = ""
        self.history: list[str] = []   # every distinct line shown, in order

    def update(self, line: str) -> None:
        if not self.enabled or line == self._last:
            return
        self._last = line
        self.history.append(line)
        if self.sink is not None:
            self.sink(line)
        elif self.notebook:
            from IPython.display import Pretty, display

            if self._handle is None:
                self._handle = display(Pretty(line), display_id=True)
            else:
                self._handle.update(Pretty(line))
        elif self.tty:
            sys.stderr.write("\r\033[K" + line)
            sys.stderr.flush()

    def finish(self, line: str) -> None:
        if not self.enabled:
            return
        if self.notebook or self.sink is not None:
            self.update(line)
            return
        elif self.tty:
            sys.stderr.write("\r\033[K" + line + "\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
