"""The notebooks' widgets in a real JupyterLab, driven by headless Chromium (Playwright).

A private JupyterLab server (free port, no token, its own config folders) serves a throw-away root
with a small notebook per widget; the test runs all cells through the Run menu, moves the controls
and checks that the output redraws. Needs Debian's chromium (`apt-get install chromium`); the test
skips without it unless DDPLAB_REQUIRE_BROWSER=1 (as in .ci/run). How they run: docs/browser-tests.md.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import expect, sync_playwright  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
UI_TIMEOUT_MS = 60_000
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
KERNEL_STATUS = "#jp-main-statusbar .jp-StatusBar-TextItem[title^='Change kernel']"
KERNEL_IDLE = re.compile(r"^(?!No Kernel).+ \| Idle$")
RUN_MENU = ".lm-MenuBar-itemLabel:text-is('Run')"
RUN_ALL = "#jp-mainmenu-run .lm-Menu-item[data-command='runmenu:run-all']"
CODE_PROMPTS = ".jp-CodeCell .jp-InputArea-prompt"
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none",
                                                                   "autoStartDefaultKernel": True},
}
NOTEBOOKS = {
    "memory_explorer.ipynb": ["import ddplab\nfrom ddplab import recipes, widgets\n"
                              "widgets.memory.memory_explorer(recipes.memory_ledger(world_size=2, steps=2), measure=ddplab.run)"],
    "rank_weights.ipynb": ["from ddplab import widgets\nwidgets.gradients.rank_weights_explorer()"],
    "ddp_magic.ipynb": ["%load_ext ddplab\n%ddp_start -n 2 --timeout 5",
                        "%%ddp\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\nprint(f'rank {rank} says hello')\nx",
                        "%%ddp\nimport time\nfor i in range(8):\n    print(f'tick {i} of rank {rank}', flush=True)\n"
                        "    time.sleep(0.5)",
                        "%%ddp\n1 / rank",   # Run All stops at this failing cell; the test runs the two below itself
                        "%%ddp --ranks 0\ndist.all_reduce(torch.ones(1))",   # hangs: rank 1 never joins
                        "%%ddp\nrank"],   # the ranks came back: no %ddp_start, no kernel restart
    "ddp_live.ipynb": ["%load_ext ddplab\n%ddp_start -n 2 --timeout 30",
                       "%%ddp\nimport time\nfor i in range(600):\n    print(f'step {i} on rank {rank}', flush=True)\n"
                       "    time.sleep(0.1)"],   # interrupted by the test
    "fit_widget.ipynb": ["import ddplab\nfrom ddplab import widgets\n"
                         "first = ddplab.plan(model='transformer', world_size=8, strategy='ddp')\n"
                         "widgets.plan.fit_widget(first, ddplab.plan, device_gib=0.003)"],
    "bucket_slider.ipynb": ["import ddplab\nfrom ddplab import widgets\nfrom ddplab.predict.comm import AlphaBeta\n"
                            "from ddplab.spec import BucketSweep\n"
                            "exp = ddplab.Experiment(name='slider-sweep', task=BucketSweep(plans=('ddp:0.004',), rounds=1,\n"
                            "    steps_per_round=2), vocab_size=64, d_model=32, n_layers=2, n_heads=4, local_batch=2, seq_len=8)\n"
                            "sweep = ddplab.run(exp, progress=False)\n"
                            "widgets.buckets.bucket_slider(sweep, AlphaBeta(1e-3, 1e-9), measure=ddplab.run)"],
}


def write_notebook(path: Path, sources: list[str]) -> None:
    cells = [{"id": f"c{i}", "cell_type": "code", "metadata": {}, "source": s, "execution_count": None, "outputs": []}
             for i, s in enumerate(["%matplotlib inline", *sources])]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": cells, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}}}))


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the server dies with pytest


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A private JupyterLab server; yields its base URL."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "root"
    root.mkdir()
    for name, sources in NOTEBOOKS.items():
        write_notebook(root / name, sources)
    settings = base / "settings"
    for name, value in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(base / "config"), JUPYTER_DATA_DIR=str(base / "data"),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"), IPYTHONDIR=str(base / "ipython"),
               DDPLAB_RUNS=str(base / "runs"))
    env.pop("MPLBACKEND", None)
    log = base / "jupyter.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", "--port=0",
             "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.password=",
             f"--ServerApp.root_dir={root}", "--allow-root"],
            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent)
        try:
            info = base / "runtime" / f"jpserver-{proc.pid}.json"
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                try:
                    url = json.loads(info.read_text())["url"]
                    urllib.request.urlopen(url + "api/status", timeout=5)
                    break
                except (OSError, ValueError, KeyError):
                    time.sleep(0.1)
            yield url
        finally:
            kernels = psutil.Process(proc.pid).children(recursive=True)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            for p in psutil.wait_procs(kernels, timeout=5)[1]:
                p.kill()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("DDPLAB_REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} not found: apt-get install -y chromium")
        pytest.skip(f"{CHROMIUM} not found: apt-get install -y chromium")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, lab, tmp_path):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(UI_TIMEOUT_MS)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield pg
        assert errors == [], errors
    finally:
        pg.screenshot(path=str(tmp_path / "final.png"))
        context.close()


def open_and_run_all(page, lab: str, name: str, ran: int | None = None) -> None:
    """Open the notebook and Run All; wait until every code cell ran (or the first `ran` did: Run All
    stops at a cell that fails, and the cells after it keep an empty prompt)."""
    page.goto(f"{lab}lab/tree/{name}?reset")
    expect(page.locator(KERNEL_STATUS)).to_have_text(KERNEL_IDLE, timeout=90_000)  # the kernel really is up
    page.locator(RUN_MENU).click()
    page.locator(RUN_ALL).click()
    page.wait_for_function(
        """([sel, ran]) => { const p = Array.from(document.querySelectorAll(sel), e => e.textContent.trim());
                    const done = p.slice(0, ran ?? p.length);
                    return p.length > 0 && !p.includes('[*]:') && done.every(t => /^\\[\\d+\\]:$/.test(t)); }""",
        arg=[f"{PANEL} {CODE_PROMPTS}", ran], timeout=UI_TIMEOUT_MS)


def record_progress(page, widget: str) -> None:
    """From now on, keep every text the widget's progress label shows, in window.__progress."""
    page.evaluate("""sel => { const el = document.querySelector(sel); window.__progress = [];
        new MutationObserver(() => window.__progress.push(el.textContent.trim()))
            .observe(el, {subtree: true, childList: true, characterData: true}); }""",
                  f"{PANEL} .ddplab-{widget} .ddplab-progress")


def measure_again_on_the_warm_ranks(page, button, widget: str, output) -> None:
    """A second click, with the settings of the first, runs on the session the first one started:
    no new ranks, a job for the warm ones."""
    record_progress(page, widget)
    button.click()
    expect(output).to_contain_text("measurement 2)")
    expect(button).to_be_enabled(timeout=60_000)   # the measurement is over
    lines = [t for t in dict.fromkeys(page.evaluate("window.__progress")) if t]
    assert any("2 warm ranks" in t for t in lines) and not any("starting" in t for t in lines), lines
    assert re.search(r" in [0-9.]+ s -> ", lines[-1]), lines


def test_memory_explorer_redraws_the_prediction_and_measures_for_real(page, lab):
    open_and_run_all(page, lab, "memory_explorer.ipynb")
    box = page.locator(f"{PANEL} .ddplab-memory-explorer")
    predicted = box.locator(".widget-output").first
    expect(predicted).to_contain_text("predicted MiB on each of the 2 ranks")
    box.locator(".widget-dropdown select").first.select_option("4")  # world_size
    expect(predicted).to_contain_text("predicted MiB on each of the 4 ranks")
    expect(predicted.locator("tbody tr")).to_have_count(3)   # after forward, after backward, after optimizer step
    # bucket views: the buckets' separate copy leaves the after-backward moment, table and figure alike
    buckets_after_backward = predicted.locator("tbody tr").nth(1).locator("td").nth(2)   # the ddp_buckets column
    expect(buckets_after_backward).to_have_text(re.compile(r"^[1-9]"))
    figure = predicted.locator("img")
    expect(figure).to_have_attribute("src", re.compile("^data:image/png;base64,"))
    without_views = figure.get_attribute("src")
    box.locator(".widget-checkbox input[type=checkbox]").check()
    expect(predicted).to_contain_text("gradient_as_bucket_view=True")
    expect(buckets_after_backward).to_have_text(re.compile(r"^0(\.0+)?$"))
    expect(figure).not_to_have_attribute("src", without_views)
    box.locator(".widget-checkbox input[type=checkbox]").uncheck()
    expect(buckets_after_backward).to_have_text(re.compile(r"^[1-9]"))
    box.locator(".widget-dropdown select").first.select_option("2")
    expect(predicted).to_contain_text("predicted MiB on each of the 2 ranks")   # the redraw is done
    button = box.locator("button.widget-button")
    progress = box.locator(".ddplab-progress")
    record_progress(page, "memory-explorer")
    button.dblclick()                     # measure for real: launches 2 ranks, once
    expect(button).to_be_disabled()
    box.locator(".widget-dropdown select").first.select_option("4")   # a control changed mid-measure
    measured = box.locator(".widget-output").nth(1)
    expect(measured.locator("table")).to_contain_text("predicted", timeout=120_000)
    expect(measured.locator("tbody tr")).to_have_count(2 * 3)   # every rank at each of the three moments
    expect(measured.locator("img")).to_have_attribute("src", re.compile("^data:image/png;base64,"))
    expect(measured).to_contain_text("measured with world_size=2")   # what it ran, not what the control says
    # the progress line moved while the ranks ran and ended on the launch's last word (it froze at
    # its first state when it was a display-id line inside an Output)
    expect(progress).to_contain_text(re.compile(r"2 ranks x 2 steps on gloo/cpu in [0-9.]+ s"))
    lines = [t for t in dict.fromkeys(page.evaluate("window.__progress")) if t]
    # in a kernel, the first run starts a session of warm ranks (and keeps it for the next click)
    assert lines[0].startswith("ddplab: starting a session of 2 warm ranks") and len(lines) >= 3, lines
    assert any(t.startswith("ddplab memory-") and "steps done" in t for t in lines), lines
    expect(predicted).to_contain_text("predicted MiB on each of the 4 ranks")
    expect(button).to_be_enabled()
    page.wait_for_timeout(3000)           # a second launch from the double click would have shown by now
    expect(measured).to_contain_text("(measurement 1)")
    expect(measured).not_to_contain_text("measurement 2")
    box.locator(".widget-dropdown select").first.select_option("2")   # the settings of the first measurement
    measure_again_on_the_warm_ranks(page, button, "memory-explorer", measured)


def test_the_fit_widget_answers_from_a_new_plan_of_the_chosen_settings(page, lab):
    open_and_run_all(page, lab, "fit_widget.ipynb")
    box = page.locator(f"{PANEL} .ddplab-fit-widget")
    answer = box.locator(".ddplab-fit")
    expect(answer).to_contain_text("ddp on 8 ranks, 8 x 16 tokens a rank: does not fit in 0.003 GiB")
    box.locator(".widget-dropdown select").nth(1).select_option("fsdp2")   # strategy
    box.locator(".widget-dropdown select").first.select_option("64")      # ranks
    button = box.locator("button.widget-button")
    button.dblclick()                     # one plan, not two
    expect(answer).to_contain_text("fsdp2 on 64 ranks, 8 x 16 tokens a rank: fits in 0.003 GiB", timeout=120_000)
    expect(button).to_be_enabled()
    expect(answer).to_contain_text(re.compile(r"peak [0-9.]+ GiB in (forward|backward|optimizer)"))


def test_rank_weights_sliders_redraw_the_plot(page, lab):
    open_and_run_all(page, lab, "rank_weights.ipynb")
    img = page.locator(f"{PANEL} .ddplab-rank-weights img")
    expect(img).to_have_attribute("src", re.compile("^data:image/png;base64,"))
    first = img.get_attribute("src")
    handle = page.locator(f"{PANEL} .ddplab-rank-weights .noUi-handle").first
    handle.focus()
    page.keyboard.press("End")  # rank 0's local batch to the maximum
    page.wait_for_function("([sel, old]) => { const i = document.querySelector(sel); return i && i.src !== old; }",
                           arg=[f"{PANEL} .ddplab-rank-weights img", first])
    at_max = img.get_attribute("src")
    page.keyboard.press("Home")  # and back to the minimum: the plot must change again
    page.wait_for_function("([sel, old]) => { const i = document.querySelector(sel); return i && i.src !== old; }",
                           arg=[f"{PANEL} .ddplab-rank-weights img", at_max])


def test_bucket_slider_redraws_the_schedule_and_measures_for_real(page, lab):
    open_and_run_all(page, lab, "bucket_slider.ipynb")
    box = page.locator(f"{PANEL} .ddplab-bucket-slider")
    table = box.locator(".widget-output table")
    expect(table).to_contain_text("ddp:")                       # starts at 4 MiB, clamped to this model's largest cap
    start = table.locator("tbody tr th").first.inner_text()
    img = box.locator(".widget-output img")
    expect(img).to_have_attribute("src", re.compile("^data:image/png;base64,"))
    first = img.get_attribute("src")
    handle = box.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press("Home")                                 # the smallest cap: one tensor per bucket
    expect(table).not_to_contain_text(start)
    page.wait_for_function("([sel, old]) => { const i = document.querySelector(sel); return i && i.src !== old; }",
                           arg=[f"{PANEL} .ddplab-bucket-slider .widget-output img", first])
    buckets = int(table.locator("tbody tr td").first.inner_text())
    assert buckets > 1
    box.locator("label:has-text('split the last bucket') input").check()
    expect(box).to_contain_text("(one tensor: no split)")         # one tensor per bucket: nothing to split
    handle.focus()
    page.keyboard.press("End")                                  # the largest cap: a single bucket
    expect(table).to_contain_text("split:")
    button = box.locator("button:has-text('measur')")
    progress = box.locator(".ddplab-progress")
    record_progress(page, "bucket-slider")
    button.dblclick()                                           # launches 2 ranks, once
    expect(button).to_be_disabled()
    handle.focus()
    page.keyboard.press("Home")                                 # the slider moved mid-measure
    status = box.locator(".widget-output").first
    expect(status).to_contain_text("measured split:", timeout=120_000)   # the plan of the click
    # the progress line followed the launch to its last word (a display-id line inside an Output froze)
    expect(progress).to_contain_text(re.compile(r"slider-measure: 2 ranks x 1 round on gloo/cpu in [0-9.]+ s"))
    lines = [t for t in dict.fromkeys(page.evaluate("window.__progress")) if t]
    # the notebook's own run started a session of 2 warm ranks: the button's launch is a job for them
    assert "2 warm ranks" in lines[0] and not any("starting" in t for t in lines) and len(lines) >= 3, lines
    expect(button).to_be_enabled()
    handle.focus()
    page.keyboard.press("Home")                                 # (the kernel may have queued the first move)
    expect(table).not_to_contain_text("measured_step_ms")       # the plan shown now was not measured
    handle.focus()
    page.keyboard.press("End")
    expect(table).to_contain_text("measured_step_ms")
    expect(box).not_to_contain_text("Warning")                  # the measured overlay draws without a layout warning
    page.wait_for_timeout(3000)
    expect(status).to_contain_text("measurement 1)")
    expect(status).not_to_contain_text("measurement 2")


def test_the_ddp_magic_shows_every_rank_side_by_side(page, lab):
    page.add_init_script("""window.__seen = [];   // every state of the page's %%ddp tables while the cells run
        new MutationObserver(() => { for (const t of document.querySelectorAll('table.ddplab-ddp-cell'))
            window.__seen.push(t.parentElement.textContent); })
        .observe(document, {subtree: true, childList: true, characterData: true});""")
    open_and_run_all(page, lab, "ddp_magic.ipynb", ran=5)   # to `1 / rank`, which fails
    tables = page.locator(f"{PANEL} table.ddplab-ddp-cell")
    expect(tables).to_have_count(3)
    first, loop, second = tables.nth(0), tables.nth(1), tables.nth(2)
    # the loop's prints appeared in the ranks' columns while it ran, not only at its end
    seen = page.evaluate("window.__seen")
    assert any("running..." in t and "tick 1 of rank 1" in t and "tick 7" not in t for t in seen), seen[-3:]
    expect(loop.locator("td").nth(1)).to_contain_text("tick 7 of rank 1")
    # a collective only rank 0 calls is named by torch's analyzer, in one line, and the ranks come back
    cells = page.locator(f"{PANEL} .jp-CodeCell")
    hung, after = cells.nth(5), cells.nth(6)
    hung.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    failed = hung.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    expect(failed).to_contain_text("never joined collective #", timeout=60_000)
    expect(failed).to_contain_text("2 new ones are starting: the next %%ddp cell waits for them")
    expect(hung.locator("details summary")).to_contain_text(["where rank 1 was when the launcher asked"])
    after.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    expect(after.locator("table.ddplab-ddp-cell td")).to_have_text(["0", "1"], timeout=60_000)
    expect(first.locator("th")).to_have_text(["rank 0", "rank 1"])
    expect(first.locator("td").nth(0)).to_contain_text("rank 0 says hello")
    expect(first.locator("td").nth(1)).to_contain_text("rank 1 says hello")
    expect(first.locator("td")).to_contain_text(["tensor([3.])", "tensor([3.])"])
    # rank 0 divides by zero: its column has the traceback, rank 1 its value, and the cell fails in one line
    expect(second.locator("td").nth(0)).to_contain_text("ZeroDivisionError")
    expect(second.locator("td").nth(1)).to_contain_text("1.0")
    expect(page.locator(f"{PANEL} .jp-CodeCell").nth(4)
           .locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")).to_contain_text(
        "CellFailed: rank 0: ZeroDivisionError")
    page.screenshot(path=str(Path(os.environ.get("DDPLAB_SCREENSHOTS", "/tmp")) / "ddp_magic.png"), full_page=True)


def test_live_ranks_say_what_they_wait_for_and_keep_their_prints_through_an_interrupt(page, lab):
    """In a browser: %ddp_start says at once what it waits for; a %%ddp loop's prints show while it
    runs, and Kernel > Interrupt keeps them on the page, saying the ranks were stopped."""
    page.add_init_script("""window.__seen = [];   // every text the notebook's outputs showed, in order
        new MutationObserver(() => { for (const o of document.querySelectorAll('.jp-OutputArea-output'))
            window.__seen.push(o.textContent); })
        .observe(document, {subtree: true, childList: true, characterData: true});""")
    page.goto(f"{lab}lab/tree/ddp_live.ipynb?reset")
    expect(page.locator(KERNEL_STATUS)).to_have_text(KERNEL_IDLE, timeout=90_000)
    page.locator(RUN_MENU).click()
    page.locator(RUN_ALL).click()
    loop = page.locator(f"{PANEL} .jp-CodeCell").nth(2)
    expect(loop.locator("table.ddplab-ddp-cell")).to_contain_text("step 5 on rank 1", timeout=90_000)
    seen = page.evaluate("window.__seen")
    starting = next(i for i, t in enumerate(seen) if "starting 2 ranks" in t)
    ready = next(i for i, t in enumerate(seen) if "2 ranks ready on" in t)
    assert starting < ready, seen[:5]   # said before the ranks were up, not only after
    page.locator(".lm-MenuBar-itemLabel:text-is('Kernel')").click()
    page.locator("#jp-mainmenu-kernel .lm-Menu-item[data-command='kernelmenu:interrupt']").click()
    expect(loop.locator(".jp-OutputArea-output").first).to_contain_text("interrupted: the ranks were stopped",
                                                                         timeout=60_000)
    expect(loop.locator("table.ddplab-ddp-cell")).to_contain_text("step 5 on rank 0")   # what they printed stays
    expect(page.locator(KERNEL_STATUS)).to_have_text(KERNEL_IDLE, timeout=60_000)
    page.screenshot(path=str(Path(os.environ.get("DDPLAB_SCREENSHOTS", "/tmp")) / "ddp_live.png"), full_page=True)
