"""tests/browser.py, the headless Chromium driver the page tests use: filling a form, evaluating, waiting, the
page's errors and a screenshot's width, on a small page of its own."""

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from browser import Browser, BrowserError, find_chromium

pytestmark = pytest.mark.cli

CHROMIUM = find_chromium()

FORM = """<!doctype html><meta charset="utf-8">
<input id="name"> <select id="size"><option value="s">small</option><option value="l">large</option></select>
<button id="go">go</button> <button id="fail">fail</button>
<div id="out"></div>
<script>
  const out = document.querySelector("#out"), seen = [];
  document.querySelector("#name").addEventListener("input", event => seen.push("input:" + event.target.value));
  document.querySelector("#name").addEventListener("change", event => seen.push("change:" + event.target.value));
  document.querySelector("#size").addEventListener("change", event => seen.push("size:" + event.target.value));
  document.querySelector("#go").addEventListener("click", () => {
    out.textContent = document.querySelector("#name").value + "/" + document.querySelector("#size").value;
    out.dataset.events = seen.join(" ");
  });
  document.querySelector("#fail").addEventListener("click", () => setTimeout(() => { throw new Error("kaboom"); }));
</script>"""


def data_url(html: str) -> str:
    return "data:text/html," + quote(html)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    with Browser(CHROMIUM, tmp_path_factory.mktemp("chromium"), timeout_s=20) as started:
        yield started


@pytest.fixture
def form(browser: Browser) -> Browser:
    browser.open(data_url(FORM))
    browser.errors.clear()
    return browser


def test_typing_choosing_and_clicking_update_the_page(form: Browser):
    form.type_into("#name", "llama")
    form.select("#size", "l")
    form.click("#go")
    assert form.evaluate("document.querySelector('#out').textContent") == "llama/l"
    assert form.evaluate("document.querySelector('#out').dataset.events") == "input:llama change:llama size:l"
    assert form.evaluate("document.activeElement.id") == "size"  # the field chosen last has the focus
    with pytest.raises(BrowserError, match="has no option xl"):
        form.select("#size", "xl")
    with pytest.raises(BrowserError, match="nothing matches #missing"):
        form.click("#missing")


def test_evaluate_awaits_a_promise_and_reports_what_the_page_throws(form: Browser):
    assert form.evaluate("new Promise(resolve => setTimeout(() => resolve({answer: [4, 2]}), 50))") == {
        "answer": [4, 2]
    }
    assert form.evaluate("undefined") is None
    with pytest.raises(BrowserError, match="TypeError"):
        form.evaluate("null.length")
    with pytest.raises(BrowserError, match="refused"):
        form.evaluate("Promise.reject(new Error('refused'))")
    assert form.errors == []  # an exception evaluate raises is not the page's error


def test_wait_for_returns_the_value_and_times_out_quickly(form: Browser):
    form.evaluate("setTimeout(() => { document.querySelector('#out').textContent = 'later'; }, 100)")
    assert form.wait_for("document.querySelector('#out').textContent") == "later"
    start = time.monotonic()
    with pytest.raises(BrowserError, match=r"waiting for window\.never\.ready: it last threw TypeError"):
        form.wait_for("window.never.ready", timeout_s=0.5)
    assert time.monotonic() - start < 2


def test_the_pages_uncaught_errors_and_console_errors_are_collected(form: Browser):
    form.click("#fail")  # throws from a timer, after the click
    form.evaluate("console.error('bad', 42)")
    deadline = time.monotonic() + 5
    while len(form.errors) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "bad 42" in form.errors
    assert any(error.startswith("Error: kaboom") for error in form.errors), form.errors


def test_a_screenshot_800_pixels_wide_is_a_png_800_pixels_wide(browser: Browser, tmp_path: Path):
    browser.set_width(800, 600)
    try:
        browser.open(data_url("<body style='margin:0'><div style='height:1500px;background:teal'></div></body>"))
        assert browser.evaluate("innerWidth") == 800
        png = browser.screenshot(tmp_path / "page.png")
    finally:
        browser.set_width(1280, 900)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "page.png").read_bytes() == png
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width == 800 * 1  # deviceScaleFactor 1
    assert height == 1500  # the whole page, not the 600 px viewport
