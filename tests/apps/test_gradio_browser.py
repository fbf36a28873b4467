"""The web demo in a real browser: Playwright drives Debian's Chromium (headless) against the app on loopback,
sets a class by name, clicks Generate, waits for the image, checks its pixels are not blank and saves a
screenshot; it switches to a text-to-image model, finds its words beside the prompt box, types a prompt and does
the same; on the Streaming tab it starts a stream, checks a live frame, stops it and waits for the video, and
with a text streaming model it starts from an example prompt and switches the stream to a typed prompt. Screenshots
go to a temporary folder, so that running the tests leaves the checkout clean;
``VGEN_WRITE_SCREENSHOT=1 pytest tests/apps/test_gradio_browser.py`` refreshes docs/results/images/
app_screenshot.png, app_prompt.png, app_streaming.png and app_streaming_switch.png. Skipped only where
Playwright or Chromium is not installed (``.ci/run`` installs both)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vgen.apps.gradio_app import MAX_STREAM_FRAMES, ModelAccess, build_app, serve
from vgen.apps.models_cli import pipeline_info
from vgen.data.scenes import EXAMPLE_PROMPTS
from vgen.pipelines import available_models, pipeline_folder

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "results" / "images" / "app_screenshot.png"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def app_page(height: int, access: ModelAccess | None = None) -> Iterator:
    """A Playwright page of headless Chromium on the app (serving the models ``access`` allows), on a free loopback
    port for the block."""
    app = build_app("shapes-c2i", max_concurrency=1, access=access or ModelAccess())
    port = _free_port()
    serve(app, port=port, prevent_thread_lock=True, quiet=True)  # as `vgen app` serves it, behind its gate
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": height})
            # not "networkidle": the page holds its heartbeat connection open (a closed tab ends its streams)
            page.goto(f"http://127.0.0.1:{port}/", wait_until="load")
            page.get_by_role("button", name="Generate").wait_for(timeout=60_000)
            yield page
            browser.close()
    finally:
        app.close()


def assert_not_blank(image) -> None:
    pixels = np.asarray(Image.open(io.BytesIO(image.screenshot())).convert("RGB")).astype(float)
    assert pixels.shape[0] > 16 and pixels.std() > 5  # a picture, not a blank box


def screenshot_path(name: str, tmp_path: Path) -> Path:
    return SCREENSHOT.with_name(name) if os.environ.get("VGEN_WRITE_SCREENSHOT") else tmp_path / name


def test_generate_in_the_browser_shows_a_non_blank_image(tmp_path: Path) -> None:
    screenshot = screenshot_path(SCREENSHOT.name, tmp_path)
    with app_page(1100) as page:
        page.get_by_label("class name or id").fill("star")
        page.get_by_role("button", name="Generate").click()
        page.get_by_text("tokens per forward").wait_for(timeout=120_000)  # the stats table of the run
        image = page.locator("img[src*='gradio_api/file=']").first  # the first output: the image grid
        image.wait_for(state="visible", timeout=30_000)
        assert_not_blank(image)
        page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000


def test_a_prompt_in_the_browser_shows_a_non_blank_image(tiny_t2i_pipeline_dir, tmp_path: Path) -> None:
    """Choosing a text-to-image model swaps the class picker for the prompt box; a typed prompt is drawn. The
    embedded shapes-t2i when it ships, else the tiny test model, offered as an operator's --model-dir."""
    model = "shapes-t2i" if "shapes-t2i" in available_models() else str(tiny_t2i_pipeline_dir)
    access = ModelAccess(folders=() if model in available_models() else (model,))
    screenshot = screenshot_path("app_prompt.png", tmp_path)
    with app_page(1100, access) as page:
        page.get_by_label("model (one this server offers)").click()
        page.get_by_role("option", name=model, exact=True).click()
        prompt = page.get_by_placeholder("describe the image")
        prompt.wait_for(state="visible", timeout=60_000)
        assert not page.get_by_label("class name or id").is_visible()
        expect(page.get_by_text("The words this model knows")).to_be_visible()
        page.get_by_label("example prompts").click()
        page.get_by_role("option", name=EXAMPLE_PROMPTS[2], exact=True).click()
        expect(prompt).to_have_value(EXAMPLE_PROMPTS[2])  # an example prompt fills the box
        prompt.fill("a small red star in the top left corner on a white background")
        page.get_by_role("button", name="Generate").click()
        page.get_by_text("tokens per forward").wait_for(timeout=120_000)
        image = page.locator("img[src*='gradio_api/file=']").first
        image.wait_for(state="visible", timeout=30_000)
        assert_not_blank(image)
        page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000


def test_streaming_in_the_browser_plays_frames_then_stops_with_a_playable_video(tmp_path: Path) -> None:
    """The Streaming tab with the embedded block-diffusion model: frames arrive while the stream runs, Stop ends it
    early, and the page then holds the video of the frames done."""
    screenshot = screenshot_path("app_streaming.png", tmp_path)
    with app_page(900) as page:
        page.get_by_role("tab", name="Streaming").click()
        page.get_by_label("class of the video").fill("2")
        page.get_by_label("frames", exact=True).fill(str(MAX_STREAM_FRAMES))
        page.get_by_role("button", name="Stream", exact=True).click()
        # a few dozen frames in (frame 32 or later), so the picture shows a stream under way
        page.get_by_text(re.compile(rf"frame ([3-9]\d|\d{{3,}}) / {MAX_STREAM_FRAMES}, class")).wait_for(
            timeout=120_000)
        latest = page.locator("img[src*='gradio_api/file=']:visible").first  # the Streaming tab's frame
        latest.wait_for(state="visible", timeout=30_000)
        assert_not_blank(latest)
        page.get_by_role("button", name="Stop", exact=True).click()
        page.get_by_text(re.compile(r"stopped: \d+ frames")).wait_for(timeout=120_000)
        page.locator("video").first.wait_for(state="visible", timeout=30_000)
        page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000


def test_a_prompt_switch_in_the_browser_reaches_the_stream_at_its_next_block(tiny_text_stream_pipeline_dir,
                                                                              tmp_path: Path) -> None:
    """The Streaming tab with a text streaming model (the embedded shapes-t2v-stream when it ships, else the tiny
    test model, offered as an operator's --model-dir): the prompt box replaces the class box, an example prompt
    fills it, the stream starts, a prompt typed in "switch to" reaches it at the next block, whose status names
    it, and Stop ends it with the video of the frames done."""
    model = "shapes-t2v-stream" if "shapes-t2v-stream" in available_models() else str(tiny_text_stream_pipeline_dir)
    access = ModelAccess(folders=() if model in available_models() else (model,))
    example = pipeline_info(pipeline_folder(model)).example_prompts[0]
    switched = "a blue ring on a white background"
    screenshot = screenshot_path("app_streaming_switch.png", tmp_path)
    with app_page(1000, access) as page:
        page.get_by_role("tab", name="Streaming").click()
        page.get_by_label("streaming model (one this server offers)", exact=True).click()
        page.get_by_role("option", name=model, exact=True).click()
        prompt = page.get_by_placeholder("describe the video")
        prompt.wait_for(state="visible", timeout=60_000)
        assert not page.get_by_label("class of the video").is_visible()
        page.get_by_label("the model's example prompts").click()
        page.get_by_role("option", name=example, exact=True).click()
        expect(prompt).to_have_value(example)  # an example prompt fills the box
        page.get_by_label("frames", exact=True).fill(str(MAX_STREAM_FRAMES))
        page.get_by_role("button", name="Stream", exact=True).click()
        page.get_by_text(re.compile(rf'frame \d+ / {MAX_STREAM_FRAMES}, prompt "{re.escape(example)}"')).wait_for(
            timeout=120_000)
        page.get_by_label("switch to").fill(switched)
        page.get_by_role("button", name="Switch at the next block").click()
        page.get_by_text(re.compile(rf'frame \d+ / {MAX_STREAM_FRAMES}, prompt "{switched}"')).wait_for(
            timeout=120_000)  # a block streamed under the new prompt
        latest = page.locator("img[src*='gradio_api/file=']:visible").first
        latest.wait_for(state="visible", timeout=30_000)
        assert_not_blank(latest)
        page.screenshot(path=str(screenshot), full_page=True)
        page.get_by_role("button", name="Stop", exact=True).click()
        # the tiny model may finish its frames before Stop lands on a loaded machine (Stop itself is the class
        # streaming test's subject): either way the page ends with the video of the frames done
        page.get_by_text(re.compile(r"(stopped|done): \d+ frames")).wait_for(timeout=120_000)
        page.locator("video").first.wait_for(state="visible", timeout=30_000)
    assert screenshot.stat().st_size > 10_000
