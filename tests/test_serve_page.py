"""The page of ``lmcalc serve`` as a person uses it, in headless Chromium (tests/browser.py): choose a preset, change TP
and the sequence length, read the bars and the verdict back; run the command the page gives and get its figures;
type something wrong and see it said by the field; open a shared link; plan; and nothing overflows at 1280 or at 800
pixels. Skipped where no Chromium can be had."""

from __future__ import annotations

import json
import shlex
import struct

import pytest
from browser import Browser, find_chromium

pytestmark = pytest.mark.cli

IDLE = "window.lmcalcPage !== undefined && document.body.dataset.busy === '0'"
SEGMENTS = """[...document.querySelectorAll('#chart-memory .segment')].map(s => ({
    bytes: Number(s.dataset.bytes), px: s.getBoundingClientRect().height, title: s.title}))"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    with Browser(chromium, tmp_path_factory.mktemp("chromium"), width=1280, height=900) as opened:
        yield opened


@pytest.fixture
def page(browser, served):
    """The page opened afresh at ``query``, once every answer it asked for is shown."""

    def open_at(query: str = "") -> Browser:
        browser.errors.clear()
        browser.set_width(1280, 900)
        browser.open(served.url + query)
        settle(browser)
        return browser

    yield open_at
    assert browser.errors == [], "the page threw or logged an error"


def settle(browser: Browser) -> None:
    """Wait out the page's debounce, then until no answer is on its way."""
    browser.evaluate("new Promise(done => setTimeout(done, 300))")
    browser.wait_for(IDLE, timeout_s=60)


def answer(browser: Browser, command: str) -> dict:
    return browser.evaluate(f"window.lmcalcPage.answers[{json.dumps(command)}]")


def test_choosing_a_preset_tp_and_seq_moves_the_bars(page, lmcalc_run):
    browser = page()
    browser.type_into("input[name=model]", "llama-3.1-70b")
    browser.type_into("input[name=tp]", "8")
    browser.type_into("input[name=seq]", "4096")
    settle(browser)
    found = answer(browser, "memory")
    assert "--model llama-3.1-70b" in found["command"] and "--tp 8" in found["command"]
    assert "--seq 4096" in found["command"]
    segments = browser.evaluate(SEGMENTS)
    # the terminal's own answer to the same question (not the page's): each bar is one of its terms, in bytes
    ran = lmcalc_run(shlex.split(found["command"])[1:]).json
    totals = ran["results"]["total"]
    assert sum(s["bytes"] for s in segments) == pytest.approx(totals["total"]["value"])
    # a bar's height is its bytes over one scale: every segment's px/bytes is the same, within a pixel's rounding
    tall = [s for s in segments if s["px"] > 20]
    scales = [s["px"] / s["bytes"] for s in tall]
    assert len(tall) >= 2 and max(scales) / min(scales) < 1.05
    capacity = browser.evaluate("Number(document.querySelector('#chart-memory .capacity').dataset.bytes)")
    assert capacity == totals["capacity"]["value"] == 85_028_896_768  # an H100's, as CUDA gives it
    verdict = browser.evaluate("document.getElementById('verdict').textContent")
    assert verdict == ("fits" if totals["total"]["value"] <= 85_028_896_768 else "does not fit")
    # TP 8 → 4 holds more of the model on each GPU: the bars grow, and the verdict follows the terminal's
    browser.type_into("input[name=tp]", "4")
    settle(browser)
    larger = sum(s["bytes"] for s in browser.evaluate(SEGMENTS))
    assert larger > totals["total"]["value"]
    ran = lmcalc_run(shlex.split(answer(browser, "memory")["command"])[1:]).json
    assert larger == pytest.approx(ran["results"]["total"]["total"]["value"])


def test_every_command_the_page_gives_answers_what_it_shows(page, lmcalc_run):
    browser = page(
        "?model=llama-3.1-8b&gpu_count=16&pp=2&tp=2&grad_accum=4&recompute=selective&tokens=1B&price_per_gpu_hour=2.5"
    )
    commands = browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#command-list .command')]"
        ".map(c => [c.dataset.command, c.querySelector('code').textContent]))"
    )
    assert set(commands) == {"memory", "memory-stages", "train-time", "fit", "max-params"}
    for command, line in commands.items():
        ran = lmcalc_run(shlex.split(line)[1:])
        assert ran.code == 0, ran.err
        assert ran.json == answer(browser, command)["json"], command
    assert "--stages" in commands["memory-stages"] and "--grad-accum 4" in commands["memory"]
    assert "--price-per-gpu-hour 2.5" in commands["train-time"]
    stages = browser.evaluate("document.querySelectorAll('#chart-stages .column').length")
    assert stages == 2  # a bar per pipeline stage


def test_a_figure_opens_its_formula_numbers_and_source(page):
    browser = page()
    title = browser.evaluate("document.querySelector('#card-memory .figure').title")
    assert title.startswith("= ") and "source:" in title
    browser.click("#card-memory .figure")
    shown = browser.evaluate("document.getElementById('work-lines').textContent")
    assert shown == title and not browser.evaluate("document.getElementById('work').hidden")


def test_bad_input_is_said_next_to_its_field(page):
    browser = page()
    browser.type_into("input[name=seq]", "lots")
    settle(browser)
    said = browser.evaluate("document.querySelector('.error[data-for=seq]').textContent")
    assert said.startswith("cannot read") or "--seq" in said, said
    assert browser.evaluate("document.getElementById('card-memory').classList.contains('failed')")
    browser.type_into("input[name=model]", "lama-3.1-8b")
    browser.type_into("input[name=seq]", "4096")
    settle(browser)
    said = browser.evaluate("document.querySelector('.error[data-for=model]').textContent")
    assert "did you mean llama-3.1-8b?" in said


def test_a_shared_link_reopens_the_same_question(page):
    browser = page()
    browser.type_into("input[name=model]", "qwen3-8b")
    browser.select("select[name=zero]", "3")
    browser.type_into("input[name=gpu_count]", "4")
    settle(browser)
    link = browser.evaluate("location.href")
    asked = answer(browser, "memory")
    assert "model=qwen3-8b" in link and "zero=3" in link and "gpu_count=4" in link
    browser.open("about:blank")
    browser.open(link)
    settle(browser)
    assert browser.evaluate("document.querySelector('select[name=zero]').value") == "3"
    assert answer(browser, "memory")["json"] == asked["json"]


def test_plan_it_ranks_layouts_in_a_table_that_sorts(page):
    browser = page("?mode=plan&global_batch=1M")
    rows = browser.evaluate("[...document.querySelectorAll('#plan-table tbody tr')].map(r => r.dataset.rank)")
    assert rows[:3] == ["1", "2", "3"]
    heads = browser.evaluate("[...document.querySelectorAll('#plan-table th')].map(h => h.textContent)")
    memory = next(i for i, head in enumerate(heads) if head.startswith("memory/GPU"))
    browser.click(f"#plan-table th:nth-child({memory + 1}) button")
    values = browser.evaluate(
        f"[...document.querySelectorAll('#plan-table tbody tr')].map(r => Number(r.cells[{memory}].dataset.value))"
    )
    assert values == sorted(values) and len(values) >= 3
    assert not browser.evaluate("document.getElementById('card-memory').offsetParent")  # the layout's cards hidden


@pytest.mark.parametrize("width", [1280, 800])
def test_nothing_overflows(page, tmp_path, width):
    browser = page("?pp=2&tp=2&gpu_count=16")
    browser.set_width(width, 900)
    settle(browser)
    png = browser.screenshot(tmp_path / f"page-{width}.png")
    (shot_width,) = struct.unpack(">I", png[16:20])
    assert shot_width == width  # a full-page screenshot grows wider when anything overflows sideways
    wider = browser.evaluate(
        f"[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > {width} + 0.5)"
        ".map(e => e.tagName + '.' + e.className)"
    )
    assert wider == []


def test_can_i_qlora_this_on_my_24_gb_card(page, lmcalc_run):
    browser = page("?gpu_count=1&gpu_type=rtx-4090&method=qlora&seq=2048")
    assert browser.evaluate("getComputedStyle(document.querySelector('input[name=lora_rank]')).display") != "none"
    found = answer(browser, "memory")
    assert "--method qlora" in found["command"]
    ran = lmcalc_run(shlex.split(found["command"])[1:]).json
    total, capacity = ran["results"]["total"]["total"]["value"], ran["results"]["total"]["capacity"]["value"]
    assert capacity == 25_250_627_584  # an RTX 4090's "24 GB" as CUDA gives it under Linux (24081 MiB)
    verdict = browser.evaluate("document.getElementById('verdict').textContent")
    assert verdict == ("fits" if total <= capacity else "does not fit")


def test_a_plans_layout_downloads_as_a_framework_config(page, lmcalc_run):
    browser = page("?mode=plan&global_batch=1M&gpu_count=16")
    browser.select("#emit-kind", "megatron")
    browser.click("#emit-download")
    browser.wait_for("window.lmcalcPage.emitted !== undefined", timeout_s=60)
    found = browser.evaluate("window.lmcalcPage.emitted")
    assert found["name"] == "lmcalc-megatron.sh" and found["command"].endswith("--emit megatron")
    ran = lmcalc_run(shlex.split(found["command"])[1:])  # the same config, printed by the command the page gives
    assert ran.code == 0 and ran.out == found["text"]


def test_hsdp_and_expert_tp_are_asked_as_the_command_line_asks_them(page, lmcalc_run):
    browser = page(
        "?model=qwen3-30b-a3b&gpu_count=16&ep=8&etp=1&tp=2&sequence_parallel=true&zero=3&hsdp=2&seq=4096&recompute=full"
    )
    found = answer(browser, "memory")
    assert "--hsdp 2" in found["command"] and "--etp 1" in found["command"]
    ran = lmcalc_run(shlex.split(found["command"])[1:])
    assert ran.code == 0, ran.err
    assert ran.json == found["json"]
    assert "HSDP=2" in ran.json["inputs"]["layout"]["value"] and "ETP=1" in ran.json["inputs"]["layout"]["value"]
