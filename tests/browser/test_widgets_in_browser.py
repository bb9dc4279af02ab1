"""Every widget notebook, run in JupyterLab in a real (headless) Chromium: the widgets show,
and moving a slider from the keyboard changes the figure behind it.

nbval proves the kernel side only. A learner sees the widgets only if the browser side
works too: a version mismatch between ipywidgets and jupyterlab_widgets, for example, shows
"Error displaying widget" while nbval stays green.

For each notebook in ``notebooks/`` that has widgets (a code cell whose stored outputs hold
a widget view, or whose source calls an ``*_explorer(`` factory), on a copy of the folder:
open it, clear all outputs, run all, then check that

- no code cell shows an error (a traceback) and no widget shows "Error displaying widget";
- every widget cell shows a widget, and every explorer cell a slider and a figure;
- in every explorer, a slider (``batch`` if there is one, else ``devices``, else the first)
  moved with the arrow keys redraws the figure: the explorer's marker line
  (``.dpkit-marker``) names the new value (``batch=13 ...``) and the image has changed;
- in a notebook with sliders but no figure, a slider moved with the keys shows its new value;
- in a notebook whose only widgets are its quiz, they show without error.

Screenshots go to ``build/browser/``: ``NAME-1-run-all.png``, ``NAME-cellN-LABEL-before.png``
and ``-after.png`` for each slider moved, ``NAME-2-end.png``, and ``NAME-failure.png``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

NOTEBOOK_DIR = Path(
    os.environ.get("DPKIT_BROWSER_NOTEBOOKS") or Path(__file__).resolve().parents[2] / "notebooks"
)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
EXPLORER_CALL = re.compile(r"\b\w+_explorer\s*\(")
# Source that may show widgets though nothing is stored yet (a notebook saved without outputs).
WIDGET_SOURCE = re.compile(r"\bipywidgets\b|\binteract(ive)?\s*\(|\b\w+_explorer\s*\(")
PREFERRED_SLIDERS = ("batch", "devices")
KEY_PRESSES = 3
STDERR = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
ERROR_TEXT = re.compile(r"Traceback|^\s*\w*(Error|Exception)\b.*:", re.MULTILINE)
RUN_TIMEOUT_MS = 150_000
LOAD_TIMEOUT_MS = 60_000

pytestmark = pytest.mark.browser


# -------------------------------------------------------------------------------------
# Which notebooks, and which of their cells, have widgets (read from the .ipynb JSON).


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def widget_cells(cells: list[dict[str, Any]]) -> list[int]:
    """Indices (among all cells) of code cells that show widgets."""
    found = []
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        stored = any(WIDGET_MIME in output.get("data", {}) for output in cell.get("outputs", []))
        if stored or EXPLORER_CALL.search(_source(cell)):
            found.append(index)
    return found


def explorer_cells(cells: list[dict[str, Any]]) -> list[int]:
    """Indices of code cells that make an explorer (slider over a figure)."""
    return [
        index
        for index, cell in enumerate(cells)
        if cell.get("cell_type") == "code" and EXPLORER_CALL.search(_source(cell))
    ]


def read_cells(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def widget_notebooks(folder: Path) -> list[Path]:
    """The notebooks with widgets (stored widget views, or source that makes widgets), found
    when the tests are collected; a notebook that is not valid JSON is kept, and fails, rather
    than silently dropped."""
    found = []
    for path in sorted(folder.glob("*.ipynb")):
        try:
            cells = read_cells(path)
        except (ValueError, KeyError, OSError):
            found.append(path)
            continue
        sources = [_source(c) for c in cells if c.get("cell_type") == "code"]
        if widget_cells(cells) or any(WIDGET_SOURCE.search(source) for source in sources):
            found.append(path)
    return found


NOTEBOOKS = widget_notebooks(NOTEBOOK_DIR)


# -------------------------------------------------------------------------------------
# Driving JupyterLab.

# 'done' once every code cell has an execution count, 'error' once a cell failed and
# nothing is running any more (Run All stops at an error), else false.
RUN_STATE_JS = """
() => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
    .map(e => e.textContent.trim());
  if (prompts.length && prompts.every(p => /^\\[\\d+\\]:$/.test(p))) return 'done';
  const failed = [...document.querySelectorAll(STDERR)]
    .some(e => /Traceback|Error:/.test(e.textContent));
  if (failed && !prompts.includes('[*]:')) return 'error';
  return false;
}
""".replace("STDERR", json.dumps(STDERR))

CLEARED_JS = """
() => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
    .map(e => e.textContent.trim());
  return prompts.length > 0 && prompts.every(p => p === '[ ]:')
    && document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-OutputArea-child').length === 0;
}
"""

# What the widget manager shows instead of a widget (@jupyter-widgets/jupyterlab-manager):
# the output itself reads "Error displaying widget[: model not found]" or stays at
# "Loading widget...", or an error view stands in for the widget ("Failed to load model
# class ...", e.g. when ipywidgets and jupyterlab_widgets do not match). Text a cell prints
# is left alone: a notebook may well explain these messages.
WIDGET_PROBLEMS_JS = """
(root) => {
  const problems = [];
  for (const output of root.querySelectorAll('.jp-OutputArea-output')) {
    const text = output.textContent.trim();
    if (output.childElementCount === 0 && /^(Error displaying widget|Loading widget)/.test(text))
      problems.push(text);
  }
  for (const view of root.querySelectorAll('.jupyter-widgets-error-widget'))
    problems.push('an error view stands in for a widget (ipywidgets and jupyterlab_widgets '
      + 'out of step? see the console errors below)');
  return problems;
}
"""

# Every expected widget cell shows a widget (or a widget error), and no widget anywhere in
# the notebook is still loading.
WIDGETS_SHOWN_JS = """
(indices) => {
  const loading = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
    .some(o => o.childElementCount === 0 && /^Loading widget/.test(o.textContent.trim()));
  if (loading) return false;
  const cells = document.querySelectorAll('.jp-Notebook .jp-Cell');
  return indices.every(i => {
    const area = cells[i] && cells[i].querySelector('.jp-OutputArea');
    return area && (area.querySelector('.jupyter-widgets') !== null
      || /Error displaying widget/.test(area.textContent));
  });
}
"""


# Indices of the cells that show a widget (or a widget error) now.
WIDGET_CELLS_JS = """
() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].flatMap((cell, i) => {
  const area = cell.querySelector('.jp-OutputArea');
  return area && (area.querySelector('.jupyter-widgets')
    || /Error displaying widget/.test(area.textContent)) ? [i] : [];
})
"""


# Closes every document in JupyterLab's main area without the "save your changes?" dialog
# (Run All left the notebook changed; the server's copy is thrown away anyway).
CLOSE_ALL_JS = """
() => {
  for (const widget of [...window.jupyterapp.shell.widgets('main')]) {
    if (widget.context) widget.context.model.dirty = false;
    widget.dispose();
  }
}
"""


class LabTab:
    """One browser page that loads JupyterLab once; each notebook opens in it after the one
    before is closed (window.jupyterapp, exposed by the lab server). A notebook whose test
    failed takes its page with it, so the next one starts from a fresh load."""

    def __init__(self, context: Any, lab: Any) -> None:
        self.context, self.lab = context, lab
        self.page: Any = None
        self.loaded = False  # JupyterLab is up in self.page
        self.console_errors: list[str] = []

    def next_page(self) -> Any:
        if self.page is None:
            self.page, self.loaded = self.context.new_page(), False
            self.page.on("console", self._on_console)
            self.page.on("pageerror", lambda e: self.console_errors.append(f"pageerror: {e}"))
        self.console_errors.clear()
        return self.page

    def _on_console(self, message: Any) -> None:
        if message.type == "error":
            self.console_errors.append(message.text.strip().splitlines()[0][:300])

    def close_notebook(self, passed: bool) -> None:
        if self.page is None:
            return
        if passed and self.loaded:
            try:
                self.page.evaluate(CLOSE_ALL_JS)
                return
            except Exception:  # the page is in a state we do not know: load a new one
                pass
        self.page.close()
        self.page, self.loaded = None, False

    def close(self) -> None:
        if self.page is not None:
            self.page.close()


class NotebookPage:
    """One notebook open in JupyterLab, with the steps of the test."""

    def __init__(self, tab: LabTab, lab: Any, path: Path, shots: Path) -> None:
        self.tab, self.page, self.lab = tab, tab.next_page(), lab
        self.path, self.shots = path, shots
        self.name, self.stem = path.name, path.stem
        self.console_errors = tab.console_errors

    # -- context for failures ---------------------------------------------------------

    def context(self) -> str:
        """What helps to understand a failure: dialogs, console errors, the server log."""
        lines = []
        try:
            dialogs = self.page.locator(".jp-Dialog").all_inner_texts()
            if dialogs:
                lines.append("dialog on screen: " + " | ".join(d.strip() for d in dialogs))
            status = self.page.locator(".jp-StatusBar-TextItem").all_inner_texts()
            lines.append("status bar: " + " | ".join(s for s in status if s.strip()))
            self.page.screenshot(path=self.shots / f"{self.stem}-failure.png")
            lines.append(f"screenshot: {self.shots / (self.stem + '-failure.png')}")
        except Exception as error:  # the page itself may be gone
            lines.append(f"(page not inspectable: {error})")
        if self.console_errors:
            lines.append("browser console errors:\n  " + "\n  ".join(self.console_errors[-10:]))
        lines.append("server log (tail):\n" + self.lab.log_tail(15))
        return "\n".join(lines)

    def fail(self, message: str) -> None:
        pytest.fail(f"{self.name}: {message}\n{self.context()}", pytrace=False)

    def wait(self, what: str, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except AssertionError as error:  # Playwright's expect() timing out
            self.fail(f"timed out waiting for {what}: {error}")
        except Exception as error:
            if type(error).__name__ != "TimeoutError":
                raise
            self.fail(f"timed out waiting for {what}: {str(error).splitlines()[0]}")

    # -- steps ----------------------------------------------------------------------------

    def open(self, number_of_cells: int) -> None:
        if self.tab.loaded:
            self.page.evaluate(
                "(path) => window.jupyterapp.commands.execute('docmanager:open', {path})"
                ".then(() => null)",
                self.name,
            )
        else:
            self.page.goto(self.lab.lab_url(self.name, workspace=self.stem), wait_until="commit")
        self.wait(
            "the notebook's cells",
            lambda: self.page.wait_for_function(
                "(n) => document.querySelectorAll('.jp-Notebook .jp-Cell').length === n",
                arg=number_of_cells,
                timeout=LOAD_TIMEOUT_MS,
            ),
        )
        self.wait_idle("the kernel to start")
        self.tab.loaded = True

    def wait_idle(self, what: str) -> None:
        idle = self.page.locator(".jp-StatusBar-TextItem:has-text('| Idle')").first
        self.wait(what, lambda: idle.wait_for(timeout=LOAD_TIMEOUT_MS))

    def menu(self, menu: str, command: str) -> None:
        item = self.page.locator(f".lm-Menu-item[data-command='{command}']")
        bar = self.page.locator(".lm-MenuBar-item", has_text=re.compile(f"^{menu}$"))
        self.wait(f"the {menu} menu", lambda: bar.click(timeout=10_000))
        self.wait(f"{menu} > {command}", lambda: item.click(timeout=10_000))

    def clear_and_run_all(self) -> None:
        self.menu("Edit", "editmenu:clear-all")
        self.wait(
            "outputs to clear",
            lambda: self.page.wait_for_function(CLEARED_JS, timeout=10_000),
        )
        self.menu("Run", "runmenu:run-all")
        state = self.wait(
            "Run All to finish",
            lambda: self.page.wait_for_function(
                RUN_STATE_JS, timeout=RUN_TIMEOUT_MS, polling=250
            ).json_value(),
        )
        self.assert_no_error_output()
        assert state == "done", f"{self.name}: Run All stopped ({state})"
        self.wait_idle("the kernel to be idle after Run All")

    def assert_no_error_output(self) -> None:
        stderr = self.page.locator(f".jp-Notebook .jp-CodeCell {STDERR}").all_inner_texts()
        errors = [text for text in stderr if ERROR_TEXT.search(text)]
        if errors:
            self.fail("a cell shows an error:\n" + "\n---\n".join(e[-1500:] for e in errors))

    def assert_widgets_shown(self, indices: list[int]) -> list[int]:
        """Wait for the widgets of these cells; fail on any widget error. Returns every cell
        that shows a widget (these and any other)."""
        self.wait(
            f"widgets to render in cells {indices}",
            lambda: self.page.wait_for_function(
                WIDGETS_SHOWN_JS, arg=indices, timeout=LOAD_TIMEOUT_MS
            ),
        )
        problems = self.page.locator(".jp-Notebook").evaluate(WIDGET_PROBLEMS_JS)
        if problems:
            self.fail("a widget did not display:\n  " + "\n  ".join(problems[:5]))
        for index in indices:
            if self.cell(index).locator(".jupyter-widgets").count() == 0:
                self.fail(f"cell {index} should show a widget but shows none")
        return self.page.evaluate(WIDGET_CELLS_JS)

    def cell(self, index: int) -> Any:
        return self.page.locator(".jp-Notebook .jp-Cell").nth(index)

    def cells_with_sliders(self, indices: list[int]) -> tuple[list[int], list[int]]:
        """Of these cells: those with a slider over a figure, and those with a slider only."""
        explorers, plain = [], []
        for index in indices:
            cell = self.cell(index)
            if cell.locator(".widget-slider .noUi-handle").count() == 0:
                continue
            has_figure = cell.locator(".jupyter-widgets img").count() > 0
            (explorers if has_figure else plain).append(index)
        return explorers, plain

    def screenshot(self, what: str, target: Any = None) -> Path:
        path = self.shots / f"{self.stem}-{what}.png"
        (target or self.page).screenshot(path=path)
        return path

    # -- moving sliders -------------------------------------------------------------------

    @staticmethod
    def pick_slider(cell: Any) -> tuple[str, Any]:
        """The slider to move (``batch``, else ``devices``, else the first) and its label."""
        for label in PREFERRED_SLIDERS:
            slider = cell.locator(f".widget-slider:has(label:text-is('{label}'))")
            if slider.count():
                return label, slider.first
        slider = cell.locator(".widget-slider:has(.noUi-handle)").first
        return slider.locator("label").first.inner_text().strip(), slider

    @staticmethod
    def press_keys(slider: Any) -> tuple[str, str]:
        """Move the slider a few steps with the arrow keys; its value before and after."""
        handle = slider.locator(".noUi-handle").first
        handle.scroll_into_view_if_needed()
        before = handle.get_attribute("aria-valuenow")
        at_top = float(before) >= float(handle.get_attribute("aria-valuemax"))
        handle.focus()
        for _ in range(KEY_PRESSES):
            handle.press("ArrowLeft" if at_top else "ArrowRight")
        # continuous_update=False commits on the key's change event; leaving commits too.
        handle.blur()
        return before, handle.get_attribute("aria-valuenow")

    def move_explorer_slider(self, index: int) -> str:
        cell = self.cell(index)
        label, slider = self.pick_slider(cell)
        image = cell.locator(".jupyter-widgets img").first
        marker = cell.locator(".dpkit-marker")
        image.scroll_into_view_if_needed()
        src_before = image.get_attribute("src")
        pixels_before = image.screenshot()
        self.screenshot(f"cell{index}-{label}-before", cell)

        before, after = self.press_keys(slider)
        assert after != before, f"{self.name} cell {index}: slider {label!r} did not move"
        value = _number(after)
        if marker.count():
            # The explorer writes this line after the figure for these values is in place.
            wanted = re.compile(rf"(^|[\s:]){re.escape(label)}={re.escape(value)}([\s,;]|$)")
            self.wait(
                f"the marker for {label}={value}",
                lambda: _expect(marker.first).to_have_text(wanted, timeout=30_000),
            )
        else:
            self.wait(
                "the figure to change",
                lambda: self.page.wait_for_function(
                    "([img, src]) => img.getAttribute('src') !== src",
                    arg=[image.element_handle(), src_before],
                    timeout=30_000,
                ),
            )
        image.evaluate("img => img.decode().catch(() => null)")
        src_after = image.get_attribute("src")
        pixels_after = image.screenshot()
        self.screenshot(f"cell{index}-{label}-after", cell)
        assert src_after != src_before, (
            f"{self.name} cell {index}: the figure's image did not change after {label} "
            f"{_number(before)} -> {value}"
        )
        assert pixels_after != pixels_before, (
            f"{self.name} cell {index}: a new image, but the same picture after {label} "
            f"{_number(before)} -> {value}"
        )
        return f"{label} {_number(before)} -> {value}"

    def move_plain_slider(self, index: int) -> str:
        cell = self.cell(index)
        label, slider = self.pick_slider(cell)
        readout = slider.locator(".widget-readout").first
        shown_before = readout.inner_text().strip()
        self.screenshot(f"cell{index}-slider-before", cell)
        before, after = self.press_keys(slider)
        assert after != before, f"{self.name} cell {index}: slider {label!r} did not move"
        _expect(readout).to_have_text(_number(after), timeout=10_000)
        self.screenshot(f"cell{index}-slider-after", cell)
        assert readout.inner_text().strip() != shown_before
        return f"{label} {_number(before)} -> {_number(after)} (no figure)"


def _number(value: str | None) -> str:
    """``aria-valuenow`` ("13.0") as the explorer's marker writes it ("13")."""
    number = float(value or "nan")
    return str(int(number)) if number.is_integer() else f"{number:g}"


def _expect(locator: Any) -> Any:
    from playwright.sync_api import expect

    return expect(locator)


# -------------------------------------------------------------------------------------
# The test.


@pytest.fixture(scope="module")
def lab_tab(browser_context: Any, lab: Any) -> Any:
    tab = LabTab(browser_context, lab)
    try:
        yield tab
    finally:
        tab.close()


@pytest.mark.skipif(not NOTEBOOKS, reason="no notebook in notebooks/ has widgets yet")
@pytest.mark.parametrize("source", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_widgets_work_in_browser(
    source: Path, lab: Any, lab_tab: LabTab, screenshots: Path, record_timing: Any
) -> None:
    copy = lab.notebook_dir / source.name  # the server's copy: the original is never opened
    try:
        cells = read_cells(copy)
    except (ValueError, KeyError, OSError) as error:
        pytest.fail(f"{source.name} is not a readable notebook: {error}", pytrace=False)
    widgets, explorers = widget_cells(cells), explorer_cells(cells)

    began = time.monotonic()
    notebook = NotebookPage(lab_tab, lab, copy, screenshots)
    fresh_load = not lab_tab.loaded
    passed = False
    try:
        notebook.open(len(cells))
        opened = time.monotonic()
        notebook.clear_and_run_all()
        ran = time.monotonic()
        shown = notebook.assert_widgets_shown(widgets)
        notebook.screenshot("1-run-all")

        with_figure, without_figure = notebook.cells_with_sliders(shown)
        missing = sorted(set(explorers) - set(with_figure))
        if missing:
            notebook.fail(f"explorer cells {missing} show no slider over a figure")
        # A notebook whose only widgets are its end-of-notebook quiz (08_pitfalls) has no
        # slider to move: that its widgets show, without error, is what the browser adds.
        moved = [notebook.move_explorer_slider(index) for index in with_figure]
        if not with_figure and without_figure:
            moved.append(notebook.move_plain_slider(without_figure[0]))
        notebook.assert_no_error_output()
        notebook.screenshot("2-end")
        passed = True
    finally:
        lab_tab.close_notebook(passed)
        lab.shutdown_kernels_of(source.name)
    done = time.monotonic()
    record_timing(
        f"{source.stem}",
        done - began,
        f"open {opened - began:.1f} s{' (JupyterLab loaded)' if fresh_load else ''}, "
        f"run all {ran - opened:.1f} s, "
        f"sliders {done - ran:.1f} s: {'; '.join(moved)}",
    )
