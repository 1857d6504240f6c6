"""The release report in a real headless Chromium, served by the Airflow plugin's app over real HTTP."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlrelease_drills.devkit import free_port
from tests.unit.test_report import END, KEY, write_cohort_rollback_run, write_promoted_run

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
SHARED_SCREENSHOT = Path("/tmp/report-screenshot.png")  # one copy for humans to look at


@pytest.fixture
def report_server(home: Path) -> Iterator[str]:
    """uvicorn serving the plugin's app under /mlrelease, as the Airflow API server mounts it (auth admitted)."""
    import uvicorn
    from fastapi import FastAPI

    from mlrelease_airflow.report_plugin import URL_PREFIX, create_app

    root = FastAPI()
    root.mount(URL_PREFIX, create_app(authorize=lambda: None))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(root, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the report server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def pixel_spread(path: Path) -> float:
    """Standard deviation of the screenshot's grey levels: near 0 for a blank (single-colour) page."""
    from PIL import Image, ImageStat

    with Image.open(path) as image:
        return float(ImageStat.Stat(image.convert("L")).stddev[0])


def open_report(url: str, screenshot: Path) -> dict[str, object]:
    """Load `url` in headless Chromium; console errors, page errors, failed requests, images, verdict."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (the browser test must not be skipped)")
    seen: dict[str, list[str]] = {"console_errors": [], "page_errors": [], "failed_requests": [], "bad_status": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: seen["console_errors"].append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.on("requestfailed", lambda r: seen["failed_requests"].append(f"{r.url}: {r.failure}"))
            page.on("response", lambda r: seen["bad_status"].append(f"{r.status} {r.url}") if r.status >= 400 else None)
            response = page.goto(url, wait_until="load")
            assert response is not None and response.status == 200
            images = page.eval_on_selector_all(
                "img", "els => els.map(e => ({src: e.getAttribute('src'), ok: e.complete && e.naturalWidth > 0}))"
            )
            verdict = page.locator("#verdict .headline")
            result = {
                **seen,
                "images": images,
                "verdict": verdict.inner_text(),
                "verdict_visible": verdict.is_visible(),
                "sections": page.eval_on_selector_all("section", "els => els.map(e => e.id)"),
            }
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return result


def assert_clean_render(seen: dict[str, object], screenshot: Path, expected_images: int) -> None:
    """No errors of any kind, every image decoded, a screenshot with real content."""
    assert seen["console_errors"] == [] and seen["page_errors"] == []
    assert seen["failed_requests"] == [] and seen["bad_status"] == []
    images = seen["images"]
    assert isinstance(images, list) and len(images) == expected_images
    assert [i["src"] for i in images if not i["ok"]] == []
    assert seen["verdict_visible"] is True
    assert seen["sections"] == ["data_quality", "model_metrics", "benchmark", "shadow", "rollout"]
    assert pixel_spread(screenshot) > 20  # a blank or single-colour page is about 0


def test_promoted_report_renders_cleanly_in_chromium(home: Path, report_server: str, tmp_path: Path) -> None:
    from mlrelease.settings import Settings
    from mlrelease.steps.report import build_report

    write_promoted_run(home)
    result = build_report(Settings.from_env(), END, log_to_mlflow=False)
    screenshot = tmp_path / "promoted.png"
    seen = open_report(f"{report_server}/mlrelease/reports/nightly_release_parcel_eta/{KEY}/index.html", screenshot)
    assert_clean_render(seen, screenshot, expected_images=len(result["files"]) - 1)
    assert seen["verdict"] == "Promoted"
    shutil.copyfile(screenshot, SHARED_SCREENSHOT)


def test_cohort_rollback_report_renders_cleanly_in_chromium(home: Path, report_server: str, tmp_path: Path) -> None:
    from mlrelease.settings import Settings
    from mlrelease.steps.report import build_report

    write_cohort_rollback_run(home)
    result = build_report(Settings.from_env(), END, log_to_mlflow=False)
    screenshot = tmp_path / "cohort_rollback.png"
    page = f"{report_server}/mlrelease/reports/nightly_release_parcel_eta/{KEY}"
    seen = open_report(page, screenshot)  # the redirect to index.html
    assert_clean_render(seen, screenshot, expected_images=len(result["files"]) - 1)
    assert seen["verdict"] == "Rolled back (cohort long_tail)"
