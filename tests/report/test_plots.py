"""Plots: valid PNGs of a fixed, predictable size; readable in grayscale; no overlapping labels."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("matplotlib", reason="reports need matplotlib: pip install 'looptune[plot]'")

from looptune.errors import ConfigError
from looptune.report import plots


def _bars(n: int) -> list[plots.Bar]:
    return [plots.Bar(label=f"recipe-number-{i}", value=10.0 / (i + 1), note=f"{i + 1:.2f}x") for i in range(n)]


def test_bar_chart_is_a_png_sized_by_its_number_of_bars(png_size):
    small = plots.hbars(_bars(2), title="t", xlabel="seconds")
    large = plots.hbars(_bars(10), title="t", xlabel="seconds")
    (w2, h2), (w10, h10) = png_size(small), png_size(large)
    assert w2 == w10 == plots.WIDTH_PX
    expected = round(plots.DPI * plots._bar_height(["x"] * 10))
    assert h10 == expected and h10 > h2


def test_line_chart_has_the_fixed_size(png_size):
    data = plots.lines([plots.Series(label="a", x=[1, 2, 3], y=[3.0, 2.0, 1.0])], title="t", xlabel="x",
                       ylabel="y")
    assert png_size(data) == (plots.WIDTH_PX, int(plots.LINE_HEIGHT_IN * plots.DPI))


def test_same_numbers_same_png_bytes():
    def draw() -> bytes:
        return plots.stacked_hbars(["a", "b"], {"x": [1.0, 2.0], "y": [0.5, 0.0]}, title="t",
                                   xlabel="ms", notes=["1", "2"])

    assert draw() == draw()


def _gray(color: str) -> float:
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_palette_neighbours_differ_in_grayscale_and_hatches_differ():
    grays = [_gray(c) for c in plots.PALETTE]
    assert all(abs(a - b) >= 0.1 for a, b in itertools.pairwise(grays))
    assert len(set(plots.HATCHES[:len(plots.PALETTE)])) == len(plots.PALETTE)
    assert all(_gray(c) < 0.75 for c in plots.LINE_COLORS)  # visible on white


def _overlaps(boxes) -> list[tuple[int, int]]:
    return [(i, j) for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2)
            if a.overlaps(b)]


def test_ten_recipes_labels_and_notes_do_not_overlap():
    from matplotlib.text import Annotation

    segments = {"data wait": [1.0] * 10, "rest of step": [2.0] * 10}
    figures = [plots.hbars_figure(_bars(10), title="t", xlabel="s"),
               plots.stacked_hbars_figure([b.label for b in _bars(10)], segments, title="t",
                                          xlabel="s", notes=["40% waiting for data"] * 10)]
    for fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        labels = [t.get_window_extent(renderer) for t in ax.get_yticklabels()]
        notes = [t.get_window_extent(renderer) for t in ax.texts if isinstance(t, Annotation)]
        assert len(labels) == 10 and len(notes) == 10
        assert not _overlaps(labels) and not _overlaps(notes)
        inside = fig.bbox
        assert all(inside.x0 <= b.x0 and b.x1 <= inside.x1 for b in labels + notes)


def test_legend_sits_outside_the_axes():
    fig = plots.lines_figure([plots.Series(label=f"s{i}", x=[1, 2], y=[i, i + 1]) for i in range(10)],
                             title="t", xlabel="x", ylabel="y")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert not legend.overlaps(fig.axes[0].get_window_extent(renderer))


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setattr(plots.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'looptune\[plot\]'"):
        plots.require_matplotlib()


def test_close_ticks_on_a_log_axis_keep_their_marks_but_not_overlapping_labels():
    # every batch size measured gets a tick; 768, 1,024, 1,536 and 2,048 sit too close on a
    # log2 axis for all four labels: the ends and the powers of two keep theirs
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048]
    fig = plots.lines_figure([plots.Series(label="samples/s", x=sizes, y=[float(s) for s in sizes],
                                           marks=[(768, 768.0, "chosen: 768")])],
                             title="t", xlabel="batch size", ylabel="samples/s", logx=2,
                             xticks=sizes)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    assert not _overlaps([t.get_window_extent(renderer) for t in labels])
    shown = [t.get_text() for t in labels]
    assert shown[0] == "1" and shown[-1] == "2,048" and "1,024" in shown and "512" in shown
    marked = sorted([*ax.xaxis.get_majorticklocs(), *ax.xaxis.get_minorticklocs()])
    assert marked == sizes  # a tick at every size measured, labelled or not


def test_spaced_ticks_keep_every_label_that_fits():
    fig = plots.lines_figure([plots.Series(label="s", x=[64, 128, 256], y=[1.0, 2.0, 3.0])],
                             title="t", xlabel="x", ylabel="y", logx=2, xticks=[64, 128, 256])
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["64", "128", "256"]
