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


def link_of(source) -> str:
    """Which link `source` ran its communication over: a run (its spec), an Experiment, several of
    them (a list, or a dict's values; distinct links joined by "; "), or a caption already written."""
    from ..spec.link import describe

    if isinstance(source, str):
        return source
    if isinstance(source, dict):
        source = list(source.values())
    if isinstance(source, (list, tuple)):
        return "; ".join(dict.fromkeys(filter(None, (link_of(s) for s in source))))
    spec = getattr(source, "spec", source)
    return describe(spec) if hasattr(spec, "backend") else ""   # a stand-in without a spec: nothing to name


def name_link(fig, source) -> None:
    """Write under the figure which link its runs' communication went over (`link_of`), so that a figure
    of timings never leaves it to the reader to guess loopback from an emulated link."""
    text = link_of(source) if source is not None else ""
    if not text:
        return
    # just below the figure's edge: the notebook's inline image (bbox_inches="tight") grows to hold it, so it
    # never sits on an axis label
    fig.text(0.995, -0.005, f"link: {text}", ha="right", va="top", fontsize=7.5, color="0.35")
