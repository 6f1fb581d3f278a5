"""lmcalc report's page as a reader gets it: the ranked layouts readable at 800 px, the layouts' picture coloured by
TP and PP with its legend off the data, and the page under 1 MB however many layouts the search finds."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import lmcalc.api as api
from lmcalc.cli import main

pytestmark = pytest.mark.cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LARGEST_PAGE = 1_000_000  # bytes


def write_report(args: list[str], path: Path, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["report", *args, "-o", str(path)])
    assert exit_info.value.code == 0, capsys.readouterr().err
    return path.read_text()


@pytest.fixture(scope="module")
def page_70b(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("page") / "70b.html"
    with pytest.raises(SystemExit):
        main(["report", "-m", "llama-3.1-70b", "--gpus", "64x8xH100", "-o", str(path)])
    return path


def grid_rows(html: str) -> list[list[str]]:
    """The ranked layouts' table, row by row (the header first), as the text of each cell."""
    (table,) = re.findall(r"<table class='grid'>(.*?)</table>", html)
    return [re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]


def test_the_layout_table_names_its_units_once(page_70b):
    header, *rows = grid_rows(page_70b.read_text())
    units = ["throughput (K tokens/s)", "per GPU (tokens/s/GPU)", "MFU (%)", "step (s)", "memory/GPU (GB)", "days"]
    assert header == ["", *units]
    assert len(rows) == 10 and all(len(row) == len(header) for row in rows)
    for code, *numbers in rows:
        assert all(len(number) <= 10 and " " not in number for number in numbers), numbers  # bare numbers
        assert max(map(len, code.split())) <= 12  # the code wraps between its parts


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_the_page_fits_800_pixels_in_chromium(page_70b, tmp_path):
    # the page, with a script that measures it, laid out by headless Chromium in a window 800 px wide: nothing
    # is wider than the window (no sideways scrolling), the ranked layouts' table included
    measure = (
        "<script>document.title = JSON.stringify({page: document.documentElement.scrollWidth, window: innerWidth,"
        " table: document.querySelector('table.grid').getBoundingClientRect().right});</script>"
    )
    probe = tmp_path / "probe.html"
    probe.write_text(page_70b.read_text().replace("</body>", measure + "</body>"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=800,2000", "--dump-dom"]  # fmt: skip
    dom = subprocess.run([CHROMIUM, *flags, probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    widths = json.loads(re.search(r"<title>(\{.*?\})</title>", dom).group(1).replace("&quot;", '"'))
    assert widths["window"] == 800
    assert widths["page"] <= 800 and widths["table"] <= 800, widths


def test_the_layouts_picture_colours_tp_and_marks_pp_with_the_legend_beside_it():
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_hex

    from lmcalc import plots

    found = api.plan(model="llama-3.1-8b", gpus="2x8xH100")
    sections = found.report.sections
    groups = {(dict(s.details)["tp"], dict(s.details)["pp"]) for s in sections}
    figure = plots.plan_figure(found)
    (axes,) = figure.axes
    drawn = [line for line in axes.get_lines() if (line.get_gid() or "").startswith("layouts-")]
    assert {line.get_gid() for line in drawn} == {f"layouts-tp{tp}-pp{pp}" for tp, pp in groups}  # one per group
    colour = {line.get_gid(): to_hex(line.get_markeredgecolor()) for line in drawn}
    marker = {line.get_gid(): line.get_marker() for line in drawn}
    tps, pps = sorted({tp for tp, _ in groups}), sorted({pp for _, pp in groups})
    assert len(set(colour.values())) == len(tps)  # one colour per TP degree, shared by its PP degrees
    for tp, pp in groups:
        assert colour[f"layouts-tp{tp}-pp{pp}"] == plots.COLOURS[tps.index(tp)].lower()
        assert marker[f"layouts-tp{tp}-pp{pp}"] == plots.PP_MARKERS[pps.index(pp)]
    # the legend lies outside the axes: no point can be under it
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legend, box = axes.get_legend().get_window_extent(renderer), axes.get_window_extent(renderer)
    assert legend.x0 >= box.x1
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert [f"TP={tp}" for tp in tps] + [f"PP={pp}" for pp in pps] == labels[: len(tps) + len(pps)]
    svg = plots.plan_svg(found)
    for tp in tps:
        assert plots.COLOURS[tps.index(tp)].lower() in svg.lower()


def test_the_page_stays_under_1_mb_with_tens_of_thousands_of_layouts(tmp_path, capsys):
    # DeepSeek-V3 on 1,024 H100s: the search finds over 50,000 layouts that fit; the picture merges the points a
    # marker would cover (at most plots.MAX_POINTS drawn) and the table shows ten, so the page stays small
    pytest.importorskip("matplotlib")
    from lmcalc import plots

    html = write_report(["-m", "deepseek-v3", "--gpus", "128x8xH100"], tmp_path / "v3.html", capsys)
    found = int(re.search(r"Layouts evaluated</td><td class='value'>\d+</td><td class='muted'>(\d+) fit", html)[1])
    assert found > 50_000
    assert len(html.encode()) < LARGEST_PAGE
    drawn = int(re.search(r"\(([\d,]+) points drawn\)", html)[1].replace(",", ""))
    assert drawn <= plots.MAX_POINTS
