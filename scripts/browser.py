"""The MLflow UI in a real browser: Debian's chromium driven by playwright (no browser download).

Used by tests/test_browser.py, and for the docs' screenshots of a sweep's parent run:

    python -m scripts.browser --uri sqlite:///mlflow.db --experiment study-digits --out scripts/screenshots/

It starts ``mlflow ui`` on a free port, shows the sweep's parent row with its summary metrics
and its children expanded, then the report.html artifact, and saves both as PNGs.
Never waits for network idle (the UI keeps polling); it waits for text and selectors.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from runner.tracking.server import QUIET_SERVER, free_port, wait_until_healthy

CHROMIUM = os.environ.get("SAMPLERLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 60_000


def chromium_available() -> bool:
    return Path(CHROMIUM).is_file()


@contextlib.contextmanager
def mlflow_ui(uri: str, log: Path) -> Iterator[str]:
    """``mlflow ui`` for ``uri`` on a free local port; yields its base URL, stops it after."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
            + ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **QUIET_SERVER},
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base, server, timeout=90)
        yield base
    finally:  # mlflow ui runs uvicorn as a child: stop the whole process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@contextlib.contextmanager
def browser_page(width: int = 1600, height: int = 900) -> Iterator[Any]:
    """A playwright page in Debian's chromium (headless)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def _close_assistant(page: Any) -> None:
    """The UI opens an assistant side panel; close it when there is one (room for the table)."""
    close = page.get_by_role("button", name="Close")
    with contextlib.suppress(Exception):
        close.first.click(timeout=3000)


def parent_row(
    page: Any,
    base: str,
    experiment_id: str,
    parent_name: str,
    metrics: Sequence[str],
    children: Sequence[str],
    screenshot: Path,
) -> str:
    """Open the experiment's runs table, show ``metrics`` as columns, expand the sweep's
    parent row; returns the parent row's text (after waiting for every child's name)."""
    page.goto(f"{base}/#/experiments/{experiment_id}/runs", wait_until="domcontentloaded")
    row = page.get_by_role("row").filter(has_text=parent_name).first
    row.wait_for()
    _close_assistant(page)
    page.get_by_role("button", name="Columns").click()
    search = page.get_by_placeholder("Search columns")
    for metric in metrics:
        search.fill(metric)
        page.get_by_text(metric, exact=True).first.click()
    page.keyboard.press("Escape")
    row = page.get_by_role("row").filter(has_text=parent_name).first
    row.locator("button").first.click()  # the expander left of the run name
    for child in children:
        page.get_by_text(child, exact=True).first.wait_for()
    # The grid renders a row in parts (pinned name column, scrolled metric columns): join them.
    row_id = row.get_attribute("row-id")
    text = "\n".join(page.locator(f'[role="row"][row-id="{row_id}"]').all_inner_texts())
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshot))
    return text


def run_overview(
    page: Any,
    base: str,
    experiment_id: str,
    run_id: str,
    waits_for: Sequence[str],
    screenshot: Path,
) -> str:
    """Open a run's page in the UI; returns its text once every string of ``waits_for`` shows
    (e.g. a dataset's name, the logged model's)."""
    page.goto(f"{base}/#/experiments/{experiment_id}/runs/{run_id}", wait_until="domcontentloaded")
    _close_assistant(page)
    for text in waits_for:
        page.get_by_text(text).first.wait_for()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshot), full_page=True)
    return str(page.locator("body").inner_text())


IN_VIEW = "e => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.top < innerHeight; }"
PAINTED = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


def _scroll_into_view(target: Any, tries: int = 20) -> None:
    """Scroll ``target`` (in the report's iframe) into view, and again until it stays there for
    two painted frames: the UI can render the iframe anew after it loads, back at its top."""
    for _ in range(tries):
        target.scroll_into_view_if_needed()
        target.evaluate(PAINTED)
        if target.evaluate(IN_VIEW):
            return
    raise TimeoutError(f"{target} does not stay in view")


def report_artifact(
    page: Any, base: str, experiment_id: str, run_id: str, screenshot: Path, scroll_to: str
) -> tuple[str, int]:
    """Open the parent run's report.html artifact in the UI; returns the rendered report's text
    and how many of its images loaded, after scrolling to the text ``scroll_to``."""
    page.goto(
        f"{base}/#/experiments/{experiment_id}/runs/{run_id}/artifacts",
        wait_until="domcontentloaded",
    )
    _close_assistant(page)
    page.get_by_text("report.html", exact=True).first.click()
    frame = page.frame_locator("iframe").first
    frame.locator("table.results").first.wait_for()
    images = frame.locator("img")
    images.last.wait_for()
    loaded = sum(
        images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0")
        for i in range(images.count())
    )
    _scroll_into_view(frame.get_by_text(scroll_to).first)
    text = frame.locator("body").inner_text()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshot))
    return text, loaded


def main(argv: Sequence[str] | None = None) -> int:
    from mlflow.tracking import MlflowClient

    from experiments.store import StoreError, experiment_id, get_run, latest_sweep, open_store

    parser = argparse.ArgumentParser(prog="python -m scripts.browser", description=__doc__)
    parser.add_argument("--uri", default=None)
    parser.add_argument("--experiment", default="samplerlab")
    parser.add_argument("--parent", default=None, help="the sweep's parent run (default: newest)")
    parser.add_argument(
        "--out", default="scripts/screenshots", help="folder for the two screenshots"
    )
    args = parser.parse_args(argv)
    try:
        client, uri = open_store(args.uri)
        exp = experiment_id(client, uri, args.experiment)
        parent = get_run(client, uri, args.parent) if args.parent else latest_sweep(client, exp)
    except StoreError as err:
        print(f"scripts.browser: {err}", file=sys.stderr)
        return 2
    if parent is None:
        print(f"scripts.browser: no sweep in experiment {args.experiment!r}", file=sys.stderr)
        return 2
    children = MlflowClient(tracking_uri=uri).search_runs(
        [parent.experiment_id], f"tags.mlflow.parentRunId = '{parent.run_id}'"
    )
    means = sorted(k for k in parent.metrics if k.endswith("/final_balanced_accuracy_mean"))
    if not means:
        print("scripts.browser: the parent run has no summary metrics (make report)")
        return 2
    out = Path(args.out)
    # Wide enough for the datasets, source and models columns and every summary metric after them.
    with mlflow_ui(uri, out / "mlflow-ui.log") as base, browser_page(2400, 1100) as page:
        parent_row(
            page,
            base,
            parent.experiment_id,
            parent.name,
            means,
            [r.info.run_name for r in children][:3],
            out / "mlflow_parent_row.png",
        )
        page.set_viewport_size({"width": 1600, "height": 1100})
        report_artifact(
            page,
            base,
            parent.experiment_id,
            parent.run_id,
            out / "mlflow_report.png",
            "Plots",
        )
    (out / "mlflow-ui.log").unlink()
    print(f"written: {out / 'mlflow_parent_row.png'}, {out / 'mlflow_report.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
