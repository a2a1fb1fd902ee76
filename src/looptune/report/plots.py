"""Plots for reports: plain numbers in, PNG bytes out (matplotlib's Agg renderer, no pyplot).

Readable at a glance and in grayscale: series differ by hatch or marker as well as by colour
(neighbouring palette colours differ in lightness), legends sit outside the axes, bar charts grow
with their number of bars (ten recipes never overlap), and every figure has a fixed DPI, so its
pixel size depends only on its shape: ``WIDTH_PX`` wide, a height set by the number of rows.

Each function draws one kind of chart; ``*_figure`` builds the matplotlib ``Figure`` (for tests
that measure label positions) and the plain name returns its PNG bytes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from looptune.errors import ConfigError

__all__ = ["DPI", "PALETTE", "WIDTH_PX", "Bar", "Series", "hbars", "hbars_figure", "lines",
           "lines_figure", "matplotlib_problem", "require_matplotlib", "stacked_hbars",
           "stacked_hbars_figure", "to_png"]

DPI = 100  # fixed: a figure's pixel size is its size in inches x 100
WIDTH_IN = 9.0
WIDTH_PX = int(WIDTH_IN * DPI)
LINE_HEIGHT_IN = 4.8  # line charts: 900 x 480 px
# dark/light alternating: consecutive colours differ by >= 0.1 in grayscale lightness (tested)
PALETTE = ("#0b2545", "#e69f00", "#c0392b", "#9ecae1", "#5b8e7d", "#f7e8a4")
# lines need contrast against the white background: no pale colours (markers tell them apart)
LINE_COLORS = ("#0b2545", "#c0392b", "#5b8e7d", "#e69f00", "#6a3d9a", "#3a7dbf", "#7f7f7f")
HATCHES = ("", "//", "..", "xx", "\\\\", "--", "++", "oo")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")
LINESTYLES = ("-", "--", ":", "-.")
HIGHLIGHT = "#e69f00"  # the chosen bar: light fill and a hatch against the dark others
LABEL_CHARS = 34  # bar labels wrap beyond this many characters


def matplotlib_problem() -> str | None:
    """Why reports cannot be drawn here, or None. Cheap: finds the package without importing it."""
    if importlib.util.find_spec("matplotlib") is None:
        return ("matplotlib is not installed: --report and looptune report draw their plots with "
                "it. Install it with: pip install 'looptune[plot]'")
    return None


def require_matplotlib() -> None:
    """Raises ConfigError naming ``pip install 'looptune[plot]'`` when matplotlib is missing."""
    problem = matplotlib_problem()
    if problem:
        raise ConfigError(problem)


@dataclass(frozen=True, kw_only=True)
class Bar:
    label: str  # the category, on the axis
    value: float
    note: str = ""  # written at the bar's end, e.g. "5.30x"
    highlight: bool = False  # drawn apart (e.g. the chosen setting) and named in the legend


@dataclass(frozen=True, kw_only=True)
class Series:
    label: str
    x: Sequence[float]
    y: Sequence[float]
    marks: Sequence[tuple[float, float, str]] = field(default_factory=tuple)  # annotated points


@contextlib.contextmanager
def _style() -> Iterator[None]:
    """matplotlib's defaults plus ours, whatever the user's matplotlibrc says (deterministic)."""
    require_matplotlib()
    import matplotlib
    import matplotlib.style

    rc = {"font.size": 10, "axes.titlesize": 12, "axes.titleweight": "bold",
          "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
          "grid.alpha": 0.35, "grid.linewidth": 0.6, "hatch.linewidth": 0.8,
          "legend.frameon": False, "svg.fonttype": "none"}
    with matplotlib.style.context("default"), matplotlib.rc_context(rc):
        yield


def _figure(height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained",
                 facecolor="white")
    FigureCanvasAgg(fig)  # an Agg canvas of its own: no pyplot, no global backend switch
    return fig


def to_png(fig: Any) -> bytes:
    """The figure as PNG bytes at :data:`DPI` (no timestamp or version in the metadata)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _wrap(label: str) -> str:
    return "\n".join(textwrap.wrap(label, LABEL_CHARS, break_long_words=False)) or label


def _bar_height(labels: Sequence[str], legend_rows: int = 0) -> float:
    """Inches: a row per bar, tall enough for its wrapped label, plus title, axis and legend."""
    lines = max((label.count("\n") + 1 for label in labels), default=1)
    return 1.45 + 0.3 * legend_rows + len(labels) * (0.22 + 0.17 * lines)


def _room(notes: Sequence[str]) -> float:
    """The value axis' end over the longest bar: space for the notes written past the bars."""
    return max(1.2, 1.06 + 0.0125 * max((len(n) for n in notes), default=0))


def hbars_figure(bars: Sequence[Bar], *, title: str, xlabel: str,
                 highlight_label: str = "chosen", base: float = 0.0) -> Any:
    """Horizontal bars, first at the top, each with its note at the end; bars start at ``base``
    (e.g. 1 for speedups: a bar's length is then the gain)."""
    labels = [_wrap(b.label) for b in bars]
    marked = any(b.highlight for b in bars)
    fig = _figure(_bar_height(labels, legend_rows=int(marked)))
    ax = fig.add_subplot()
    ys = range(len(bars))
    colors = [HIGHLIGHT if b.highlight else PALETTE[0] for b in bars]
    drawn = ax.barh(ys, [b.value - base for b in bars], left=base, color=colors,
                    edgecolor="#222222", linewidth=0.6, height=0.62)
    for rect, bar in zip(drawn, bars):
        rect.set_hatch("//" if bar.highlight else "")  # per bar: a hatch list needs mpl >= 3.10
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.set_title(title, loc="left")
    ax.set_xlabel(xlabel)
    top = max((b.value for b in bars), default=1.0)
    room = _room([b.note for b in bars])
    ax.set_xlim(base, base + room * (top - base) if top > base else base + 1.0)
    _thousands(ax.xaxis)
    for rect, bar in zip(drawn, bars):
        if bar.note:
            ax.annotate(bar.note, (bar.value, rect.get_y() + rect.get_height() / 2),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=9)
    if marked:
        from matplotlib.patches import Patch

        fig.legend([Patch(facecolor=HIGHLIGHT, hatch="//", edgecolor="#222222")],
                   [highlight_label], loc="outside lower center")
    return fig


def hbars(bars: Sequence[Bar], **kwargs: Any) -> bytes:
    with _style():
        return to_png(hbars_figure(bars, **kwargs))


def stacked_hbars_figure(labels: Sequence[str], segments: dict[str, Sequence[float]], *,
                         title: str, xlabel: str, notes: Sequence[str] | None = None) -> Any:
    """One horizontal bar per label, split into ``segments`` (name -> a value per label)."""
    wrapped = [_wrap(label) for label in labels]
    # a segment that is zero everywhere would only add a legend entry for nothing; the others
    # keep their colour and hatch, so a phase looks the same in every chart
    shown = [(i, k, v) for i, (k, v) in enumerate(segments.items()) if any(x > 0 for x in v)]
    shown = shown or [(i, k, v) for i, (k, v) in enumerate(segments.items())]
    ncols = min(len(shown), 3)
    rows = -(-len(shown) // ncols)
    fig = _figure(_bar_height(wrapped, legend_rows=rows) + 0.15)
    ax = fig.add_subplot()
    ys = list(range(len(labels)))
    left = [0.0] * len(labels)
    for i, name, values in shown:
        ax.barh(ys, values, left=left, label=name, color=PALETTE[i % len(PALETTE)],
                hatch=HATCHES[i % len(HATCHES)], edgecolor="#222222", linewidth=0.6, height=0.62)
        left = [a + b for a, b in zip(left, values)]
    ax.set_yticks(ys, wrapped)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.set_title(title, loc="left")
    ax.set_xlabel(xlabel)
    ax.set_xlim(0, max(left, default=1.0) * _room(notes or []) or 1.0)
    _thousands(ax.xaxis)
    for y, total, note in zip(ys, left, notes or []):
        ax.annotate(note, (total, y), xytext=(4, 0), textcoords="offset points", va="center",
                    fontsize=9)
    fig.legend(loc="outside lower center", ncols=ncols)
    return fig


def stacked_hbars(labels: Sequence[str], segments: dict[str, Sequence[float]],
                  **kwargs: Any) -> bytes:
    with _style():
        return to_png(stacked_hbars_figure(labels, segments, **kwargs))


def lines_figure(series: Sequence[Series], *, title: str, xlabel: str, ylabel: str,
                 hlines: Sequence[tuple[float, str]] = (),
                 spans: Sequence[tuple[float, float, str]] = (),
                 areas: Sequence[Series] = (), logx: float | None = None, integer_x: bool = False,
                 ylim0: bool = True, ymax: float | None = None, yunit: str = "",
                 xticks: Sequence[float] | None = None) -> Any:
    """Lines with markers (a marker and dash per series), optional filled ``areas`` under them
    (stacked from zero in order when they share their x),
    horizontal reference lines, shaded x ``spans`` and annotated points; legend on the right.
    ``ymax`` cuts the y axis (points above it are named in the legend); ``xticks``: a tick at
    each of these x (e.g. every batch size measured) instead of matplotlib's choice."""
    fig = _figure(LINE_HEIGHT_IN)
    ax = fig.add_subplot()
    bottom = [0.0] * len(areas[0].x) if areas else []
    for i, area in enumerate(areas):
        base = bottom if len(bottom) == len(area.y) else [0.0] * len(area.y)
        top = [b + y for b, y in zip(base, area.y)]
        ax.fill_between(area.x, base, top, step="mid", label=area.label, alpha=0.55, linewidth=0,
                        color=PALETTE[(i + 1) % len(PALETTE)],
                        hatch=HATCHES[(i + 2) % len(HATCHES)])
        bottom = top
    for x0, x1, label in spans:
        ax.axvspan(x0, x1, color="#bbbbbb", alpha=0.35, hatch="..", label=label, linewidth=0)
    dense = any(len(s.x) > 60 for s in series)
    for i, s in enumerate(series):
        ax.plot(s.x, s.y, label=s.label, color=LINE_COLORS[i % len(LINE_COLORS)],
                marker=None if dense else MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES[i % len(LINESTYLES)] if len(series) > 1 else "-",
                linewidth=1.2 if dense else 1.6, markersize=6, markeredgecolor="#222222",
                markeredgewidth=0.5)
        _marks(ax, s)
    for k, (y, label) in enumerate(hlines):
        ax.axhline(y, color="#444444", linestyle=LINESTYLES[(k + 1) % len(LINESTYLES)],
                   linewidth=1.1, label=label)
    _axes_text(ax, title, xlabel, ylabel, logx, integer_x, ylim0)
    if xticks is not None:
        _spaced_xticks(fig, ax, sorted(set(xticks)), logx)
    if ylim0 and any(s.marks for s in series):  # headroom: a mark's note stays under the title
        ys = [y for s in series for y in s.y] + [y for y, _ in hlines]
        ax.set_ylim(top=1.18 * max(ys, default=1.0))
    if ymax is not None:
        _clip(ax, series, ymax, yunit)
    handles, _ = ax.get_legend_handles_labels()
    if len(handles) > 1 or (handles and (hlines or spans or areas)):
        fig.legend(loc="outside right upper")
    return fig


def _spaced_xticks(fig: Any, ax: Any, ticks: list[float], logx: float | None) -> None:
    """A tick at each x; a label at those whose labels do not touch a neighbour's (close values
    on a log axis, e.g. 768, 1,024, 1,536, 2,048, would print over each other): the first and
    last first, then powers of the log base, then the rest from the left. The others keep a short
    unlabelled tick."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xticks(ticks)
    ax.xaxis.set_minor_locator(NullLocator())
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    spans = {x: (box.x0 - 4, box.x1 + 4) for x, box in zip(
        ax.xaxis.get_majorticklocs(), (t.get_window_extent(renderer)
                                        for t in ax.xaxis.get_majorticklabels()))}

    def rank(i: int) -> tuple[int, int]:
        x = ticks[i]
        power = bool(logx) and x > 0 and math.isclose(
            round(math.log(x, logx)), math.log(x, logx), abs_tol=1e-9)
        return (0 if i in (0, len(ticks) - 1) else 1 if power else 2), i

    kept: list[float] = []
    for i in sorted(range(len(ticks)), key=rank):
        a0, a1 = spans.get(ticks[i], (0.0, 0.0))
        if all(a1 < spans[k][0] or spans[k][1] < a0 for k in kept if k in spans):
            kept.append(ticks[i])
    ax.set_xticks(sorted(kept))
    ax.xaxis.set_minor_locator(FixedLocator([x for x in ticks if x not in kept]))


def _marks(ax: Any, s: Series) -> None:
    """A star on each marked point; its note above it, on the side the line does not rise into
    (left of a rising line or of the last point, right otherwise and of the first point)."""
    points = sorted(zip(s.x, s.y))
    for x, y, text in s.marks:
        ax.plot([x], [y], marker="*", markersize=13, color=HIGHLIGHT, markeredgecolor="#222222",
                linestyle="none", zorder=5)
        if not text:
            continue
        after = [py for px, py in points if px > x]
        left = any(px < x for px, _ in points) and (not after or after[0] > y)
        ax.annotate(text, (x, y), xytext=(-10 if left else 10, 10), zorder=6,
                    textcoords="offset points", fontsize=9, ha="right" if left else "left",
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "#888888"})


def _axes_text(ax: Any, title: str, xlabel: str, ylabel: str, logx: float | None,
               integer_x: bool, ylim0: bool) -> None:
    from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter

    ax.set_title(title, loc="left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log", base=logx)
        if logx == 10:  # 1, 2, 5, 10, 20, ...: readable values, not only powers of ten
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        _thousands(ax.xaxis)
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ylim0:
        ax.set_ylim(bottom=0)
    _thousands(ax.yaxis)


def _thousands(axis: Any) -> None:
    """Tick labels as 175,000 and 0.5 (not 175000 or 1e+05)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 1000
                                           else f"{v:g}"))


def _clip(ax: Any, series: Sequence[Series], ymax: float, unit: str) -> None:
    """Cut the y axis at ``ymax``: points above it become triangles on the top edge, named in the
    legend with how many there are and the highest value (nothing written over the data)."""
    ax.set_ylim(top=ymax)
    above = [(x, y) for s in series for x, y in zip(s.x, s.y) if y > ymax]
    if above:
        highest = max(y for _, y in above)
        ax.plot([x for x, _ in above], [ymax] * len(above), marker="^", color="#c0392b",
                markersize=8, clip_on=False, linestyle="none", zorder=6,
                label=f"{len(above)} above the axis (up to {highest:,.4g}{unit})")


def lines(series: Sequence[Series], **kwargs: Any) -> bytes:
    with _style():
        return to_png(lines_figure(series, **kwargs))
