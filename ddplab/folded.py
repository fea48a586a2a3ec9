"""Lines a learner reads at a glance, with their details folded beneath: a timing verdict (`ddplab.claims`)
is one line, and its statistics one click away.

In Jupyter a `Folded` shows as a `<details>` block whose summary is the lines; where no HTML shows (a
terminal, a log) its repr is the lines with the details indented under them, and `show` prints the lines
alone outside a kernel.
"""

from __future__ import annotations

import contextlib
import time

__all__ = ["Folded", "show", "working"]


class Folded:
    """Lines to read at a glance, with the details folded beneath them: a `<details>` block in Jupyter,
    the details indented under the lines where no HTML shows."""

    def __init__(self, lines: str, details: str):
        self.lines, self.details = lines, details

    def _repr_html_(self) -> str:
        import html

        head = "<br>".join(f"<code>{html.escape(x)}</code>" for x in self.lines.splitlines())
        return f"<details><summary>{head}</summary><pre>{html.escape(self.details)}</pre></details>"

    def __repr__(self) -> str:
        return self.lines + "".join(f"\n    {line}" for line in self.details.splitlines())


def show(shown: Folded, plain: str | None = None) -> None:
    """The lines: in Jupyter with the details folded beneath them, elsewhere `plain` if given, else the lines
    alone (a verdict's `details()` has the rest)."""
    if _kernel() is not None:
        from IPython.display import display

        display(shown)
    else:
        print(shown.lines if plain is None else plain)


def _kernel():
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        return None
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


@contextlib.contextmanager
def working(what: str):
    """In Jupyter, a line saying what a slow step is doing while it runs ("reading 2 profiler traces..."),
    then how long it took; elsewhere nothing (a log or a test's output stays as it was)."""
    if _kernel() is None:
        yield
        return
    from IPython.display import Pretty, display

    handle, t0 = display(Pretty(f"{what}..."), display_id=True), time.perf_counter()
    try:
        yield
    finally:
        handle.update(Pretty(f"{what}: {time.perf_counter() - t0:.1f} s"))
