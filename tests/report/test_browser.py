"""The HTML reports as a person sees them (issue 34): each kind opened in a real headless
Chromium. At 1280 px wide every image decodes, the console shows no error, nothing is wider than
the window or sticks out of the text column, and every table fits without scrolling; in narrow
windows (800 px, a phone's 390 px) the page still never scrolls sideways (a wide table may
scroll inside its own box). The browser is driven by tools/screenshots.py (the DevTools
Protocol over a pipe; no Python package needed), which makes docs/screenshots from the same
reports.

Skips, with the reason, where no Chromium is installed (.ci/run installs Debian's chromium).
The checks are checked too: copies of a report with a broken image, a console error or an
over-wide element must fail them.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="reports need matplotlib: pip install 'looptune[plot]'")

from looptune.report.build import write_report

TOOL = Path(__file__).resolve().parents[2] / "tools" / "screenshots.py"
_spec = importlib.util.spec_from_file_location("looptune_screenshots", TOOL)
shots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shots)

NARROW = (800, 390)


@pytest.fixture(scope="module")
def browser():
    binary = shots.find_chromium()
    if binary is None:
        pytest.skip("no Chromium to open the reports in: apt-get install chromium (Debian), or "
                    "set LOOPTUNE_CHROMIUM to a Chromium or Chrome binary")
    with shots.Browser(binary) as opened:
        yield opened


def _look(browser, page: Path, folder: Path | None = None) -> dict:
    """Open ``page`` at 1280 px and in the narrow windows; assert a person sees nothing wrong.
    The 1280 px record."""
    seen = browser.open(page)
    assert shots.problems(seen) == [], f"{page} at {shots.WIDTH} px"
    assert seen["innerWidth"] == shots.WIDTH and seen["images"] and seen["tables"]
    assert all(img["shownWidth"] > 100 for img in seen["images"])
    if folder is not None:  # every plot written beside the page is on it
        assert len(seen["images"]) == len(list(folder.glob("*.png")))
    for width in NARROW:
        narrow = browser.open(page, width=width)
        assert shots.problems(narrow, narrow=True) == [], f"{page} at {width} px"
    return seen


# ----------------------------------------------------- synthetic results of every kind (fast)

@pytest.fixture
def wide_bench(make_bench):
    """The widest bench table: 10 recipes (one with a long name), a target, 2 ranks: 14 columns."""
    return make_bench(10, epochs=3, world_size=2)


@pytest.mark.parametrize("kind", ["bench", "wide-bench", "diagnosis", "diagnose-ranks",
                                  "tune-loader", "tune-batch-size", "pack-bench"])
def test_every_kind_looks_right_in_a_browser(browser, samples, wide_bench, write_json, tmp_path,
                                             kind):
    data = wide_bench if kind == "wide-bench" else samples[kind]
    folder = tmp_path / "rep"
    write_report(write_json(tmp_path / "r.json", data), folder)
    _look(browser, folder / "report.html", folder)
    if kind == "wide-bench":
        assert "scaling eff." in (folder / "report.html").read_text()


# ------------------------------------------------------------ the checks catch what they guard

_WIDE_TABLE = ('<div class="table-wrap"><table><tr>'
               + "".join(f"<td>{i:,}000000</td>" for i in range(40)) + "</tr></table></div>")
BREAKAGES = {
    "broken image": (lambda page: re.sub(r'src="data:image/png;base64,[^"]+"',
                                         'src="data:image/png;base64,iVBORw0KGgoAAAA"', page,
                                         count=1), "does not decode"),
    "missing image file": (lambda page: page.replace(
        "</body>", '<figure><img src="missing.png" alt="lost"></figure></body>'),
        "does not decode"),
    "console error": (lambda page: page.replace(
        "</body>", '<script>console.error("looptune test")</script></body>'),
        "console.error: looptune test"),
    "uncaught exception": (lambda page: page.replace(
        "</body>", "<script>no_such_function()</script></body>"), "uncaught: ReferenceError"),
    "over-wide element": (lambda page: page.replace(
        "</h1>", '</h1><div style="width:1600px">wide</div>'), "the page scrolls sideways"),
    "element out of the column": (lambda page: page.replace(
        "</h1>", '</h1><p style="width:1080px">pushed</p>'), "sticks out of the text column"),
    "table too wide for 1280 px": (lambda page: page.replace("</h1>", "</h1>" + _WIDE_TABLE),
                                   "needs scrolling sideways to read"),
}


@pytest.fixture
def loader_page(samples, write_json, tmp_path) -> Path:
    write_report(write_json(tmp_path / "r.json", samples["tune-loader"]), tmp_path / "rep")
    return tmp_path / "rep" / "report.html"


def test_the_checks_fail_on_broken_copies_of_a_report(browser, loader_page, tmp_path):
    assert shots.problems(browser.open(loader_page)) == []  # the intact page passes
    page = loader_page.read_text()
    missed = {}
    for name, (change, expected) in BREAKAGES.items():
        broken = tmp_path / f"{name.replace(' ', '-')}.html"
        broken.write_text(change(page))
        assert broken.read_text() != page, name
        found = shots.problems(browser.open(broken))
        if not any(expected in problem for problem in found):
            missed[name] = found
    assert not missed, f"the checks did not see: {missed}"


def test_a_table_may_scroll_in_its_box_in_a_narrow_window_but_not_the_page(browser, loader_page,
                                                                          tmp_path):
    page = tmp_path / "report.html"
    page.write_text(loader_page.read_text().replace("</h1>", "</h1>" + _WIDE_TABLE))
    narrow = browser.open(page, width=390)
    assert narrow["scrolling"] and narrow["scrollWidth"] <= narrow["innerWidth"]
    assert shots.problems(narrow, narrow=True) == []


# ------------------------------------------------------- the reports of real runs on MNIST

@pytest.fixture(scope="module")
def real_reports(mnist_dir, tmp_path_factory) -> dict:
    """bench, diagnose, tune loader and tune batch-size reports of small real runs (~25 s)."""
    return shots.build_reports(tmp_path_factory.mktemp("reports"), mnist_dir)


@pytest.mark.integration
@pytest.mark.parametrize("kind", list(shots.REPORTS))
def test_real_reports_look_right_and_screenshot(browser, real_reports, png_size, tmp_path, kind):
    page = real_reports[kind]
    seen = _look(browser, page, page.parent)
    browser.open(page)
    height = min(seen["scrollHeight"], shots.MAX_HEIGHT)
    shot = browser.screenshot(tmp_path / f"report-{kind}.png", height)
    assert png_size(shot.read_bytes()) == (shots.WIDTH, height)
    if kind == "tune":  # the loss of each trial is a column, not part of its settings' label
        text = page.read_text()
        assert "loss parity" in text and "loss=" not in text
