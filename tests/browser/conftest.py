"""Fixtures for the real-browser tests: a throwaway JupyterLab and a headless Chromium.

The tests need Debian's Chromium at ``/usr/bin/chromium`` (or ``DPKIT_CHROMIUM``) and the
Python package ``playwright`` (its own browser downloads are never used). Without them the
tests are skipped with the reason; with ``DPKIT_REQUIRE_BROWSER=1`` (what ``.ci/run`` sets)
they fail instead, so CI cannot pass without running them.

The server and the browser live for one test module, so they are gone (and checked to be
gone) before the rest of the suite runs. Screenshots go to ``build/browser/``; the folder is
named at the end of the run, with the time each step took.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from labserver import LAB_SETTINGS, LabServer, descendants, still_alive

REPO = Path(__file__).resolve().parents[2]
# The course's notebooks; another folder (a scratch notebook while developing) with
# DPKIT_BROWSER_NOTEBOOKS.
NOTEBOOK_DIR = Path(os.environ.get("DPKIT_BROWSER_NOTEBOOKS") or REPO / "notebooks")
SCREENSHOT_DIR = REPO / "build" / "browser"
CHROMIUM = Path(os.environ.get("DPKIT_CHROMIUM", "/usr/bin/chromium"))
REQUIRED = os.environ.get("DPKIT_REQUIRE_BROWSER", "") not in ("", "0")
CHROMIUM_ARGS = [
    "--no-sandbox",  # runs as root in containers and CI
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# What the run did, for the summary at the end: (what, seconds, details).
TIMINGS: list[tuple[str, float, str]] = []
_STAGE: dict[str, float] = {}


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return (
            f"no Chromium at {CHROMIUM}: install Debian's `apt-get install chromium` "
            "(or set DPKIT_CHROMIUM) to run the real-browser tests"
        )
    if importlib.util.find_spec("playwright") is None:
        return "the Python package playwright is not installed (requirements/course.txt has it)"
    return None


@pytest.fixture(scope="session")
def browser_available() -> None:
    reason = browser_missing()
    if reason is None:
        return
    if REQUIRED:
        pytest.fail(f"DPKIT_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(f"real-browser tests skipped: {reason}")


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """``build/browser/``, emptied of the screenshots of an earlier run."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOT_DIR.glob("*.png"):
        old.unlink()
    return SCREENSHOT_DIR


@pytest.fixture(scope="module")
def lab(browser_available: None) -> Iterator[LabServer]:
    """JupyterLab on 127.0.0.1, a free port and a random token, over a copy of notebooks/."""
    _STAGE.setdefault("start", time.monotonic())
    server = LabServer(NOTEBOOK_DIR)
    try:
        server.start()
        TIMINGS.append(("server ready", server.startup_seconds, f"port {server.port}"))
        cmdline = Path(f"/proc/{server.process.pid}/cmdline")
        if cmdline.exists():  # what every local user can read
            assert server.token not in cmdline.read_text(), "the token is on the command line"
        for plugin, wanted in LAB_SETTINGS.items():
            settings = server.lab_settings(plugin)
            applied = {key: settings.get(key) for key in wanted}
            assert applied == wanted, f"lab settings for {plugin} not applied: {applied}"
        yield server
    finally:
        survivors = server.stop()
        server.cleanup()
        _STAGE["end"] = time.monotonic()
    assert not survivors, "processes outlived the JupyterLab server:\n" + "\n".join(
        f"  {pid}: {cmd}" for pid, cmd in survivors.items()
    )


@pytest.fixture(scope="module")
def browser(browser_available: None) -> Iterator[Any]:
    """Headless Debian Chromium driven by Playwright; it and its driver must end with it."""
    from playwright.sync_api import sync_playwright

    _STAGE.setdefault("start", time.monotonic())
    began = time.monotonic()
    before = set(descendants(os.getpid()))
    playwright = sync_playwright().start()
    started: dict[int, str] = {}
    try:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        TIMINGS.append(("browser ready", time.monotonic() - began, str(CHROMIUM)))
        try:
            yield chromium
        finally:
            started = {
                pid: cmd for pid, cmd in descendants(os.getpid()).items() if pid not in before
            }
            chromium.close()
    finally:
        playwright.stop()
    # Only what Playwright started: the JupyterLab server (another fixture) is not below it.
    ours = {pid: cmd for pid, cmd in started.items() if "chrom" in cmd or "playwright" in cmd}
    survivors = still_alive(ours, wait=10.0)
    assert not survivors, "browser processes outlived the test session:\n" + "\n".join(
        f"  {pid}: {cmd[:200]}" for pid, cmd in survivors.items()
    )


@pytest.fixture(scope="session")
def record_timing() -> Any:
    """``record_timing(what, seconds, details)``: a line of the summary at the end."""
    return lambda what, seconds, details="": TIMINGS.append((what, seconds, details))


@pytest.fixture(scope="module")
def browser_context(browser: Any, lab: LabServer) -> Iterator[Any]:
    """One context for all notebooks; any request that is not to the lab server is refused."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(30_000)
    context.route(
        lambda url: not url.startswith(lab.url + "/"),
        lambda route: route.abort(),
    )
    try:
        yield context
    finally:
        context.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMINGS and "start" not in _STAGE:
        return
    write = terminalreporter.write_line
    terminalreporter.section("real-browser tests")
    for what, seconds, details in TIMINGS:
        write(f"{what:<24} {seconds:6.1f} s  {details}")
    if "start" in _STAGE and "end" in _STAGE:
        write(f"{'whole browser stage':<24} {_STAGE['end'] - _STAGE['start']:6.1f} s")
    if SCREENSHOT_DIR.is_dir() and any(SCREENSHOT_DIR.glob("*.png")):
        write(f"screenshots: {SCREENSHOT_DIR}")
