"""The web demo in a real browser: Playwright drives Debian's Chromium (headless) against the app on loopback,
sets a class, clicks Generate, waits for the image, checks its pixels are not blank and saves a screenshot. The
screenshot goes to a temporary folder, so that running the tests leaves the checkout clean;
``VGEN_WRITE_SCREENSHOT=1 pytest tests/apps/test_gradio_browser.py`` refreshes the README's docs/app_screenshot.png.
Skipped only where Playwright or Chromium is not installed (``.ci/run`` installs both)."""

from __future__ import annotations

import io
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vgen.apps.gradio_app import build_app

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "app_screenshot.png"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_generate_in_the_browser_shows_a_non_blank_image(tmp_path: Path) -> None:
    screenshot = SCREENSHOT if os.environ.get("VGEN_WRITE_SCREENSHOT") else tmp_path / "app.png"
    app = build_app("shapes-c2i", max_concurrency=1)
    port = _free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.goto(f"http://127.0.0.1:{port}/", wait_until="networkidle")
            class_box = page.get_by_label("class id")
            class_box.fill("3")
            page.get_by_role("button", name="Generate").click()
            page.get_by_text("tokens per forward").wait_for(timeout=120_000)  # the stats table of the run
            image = page.locator("img[src*='gradio_api/file=']").first  # the first output: the image grid
            image.wait_for(state="visible", timeout=30_000)
            pixels = np.asarray(Image.open(io.BytesIO(image.screenshot())).convert("RGB")).astype(float)
            assert pixels.shape[0] > 16 and pixels.std() > 5  # a picture, not a blank box
            page.screenshot(path=str(screenshot), full_page=True)
            browser.close()
    finally:
        app.close()
    assert screenshot.stat().st_size > 10_000
