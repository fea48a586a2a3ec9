"""Where a figure is drawn: through pyplot (a notebook cell shows it), or detached from pyplot's
global state (a widget callback, which ipykernel may run on another thread while a cell draws).
Used by the widgets of notebooks 01 and 05."""

from __future__ import annotations


def subplots(figsize, nrows: int = 1, ncols: int = 1, detached: bool = False, **kwargs):
    """(figure, axes) like `plt.subplots`; `detached=True` makes a Figure pyplot never sees (display it)."""
    if detached:
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize)
        return fig, fig.subplots(nrows, ncols, **kwargs)
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=figsize, **kwargs)
