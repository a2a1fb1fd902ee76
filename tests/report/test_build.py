"""Results JSON -> report folder: every kind renders, the HTML is self-contained, bad files fail."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("matplotlib", reason="reports need matplotlib: pip install 'looptune[plot]'")

from looptune.errors import DataError
from looptune.report import build
from looptune.report.plots import DPI, LINE_HEIGHT_IN, WIDTH_PX

EXPECTED_PNGS = {
    "bench": {"s_per_epoch.png", "breakdown.png", "loss.png", "accuracy.png"},
    "diagnosis": {"breakdown.png", "steps.png", "remedies.png", "verify.png"},
    "diagnose-ranks": {"ranks.png", "rank1-breakdown.png", "rank1-steps.png",
                       "rank1-remedies.png", "rank1-verify.png"},
    "tune-loader": {"workers.png", "trials.png"},
    "tune-batch-size": {"batch_throughput.png", "batch_memory.png"},
    "pack-bench": {"pack.png"},
}
LINE_CHARTS = {"loss.png", "accuracy.png", "steps.png", "rank1-steps.png", "workers.png",
               "batch_throughput.png", "batch_memory.png"}


@pytest.fixture
def render(tmp_path, write_json):
    """``render(data, name)`` -> (report folder, files written)."""

    def go(data: dict, name: str = "r"):
        src = write_json(tmp_path / f"{name}.json", data)
        out = tmp_path / f"{name}-report"
        return out, build.write_report(src, out)

    return go


@pytest.mark.parametrize("kind", sorted(EXPECTED_PNGS))
def test_every_kind_renders_pngs_markdown_and_self_contained_html(render, png_size, samples,
                                                                  kind):
    assert build.detect_kind(samples[kind]) == kind
    out, written = render(samples[kind], kind)
    pngs = {p.name for p in written if p.suffix == ".png"}
    assert pngs == EXPECTED_PNGS[kind]
    for name in pngs:
        width, height = png_size((out / name).read_bytes())
        assert width == WIDTH_PX and 150 <= height <= 1200
        if name in LINE_CHARTS:
            assert height == int(LINE_HEIGHT_IN * DPI)
        assert (out / name).stat().st_size < 150_000
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(pngs)
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)  # nothing from the network
    md = (out / "report.md").read_text()
    assert all(f"]({name})" in md for name in pngs)


def test_diagnosis_html_shows_the_verdict_remedies_and_verify(render, samples):
    out, _ = render(samples["diagnosis"])
    page = (out / "report.html").read_text()
    assert "bottleneck: data_loading (the step waits for the next batch)" in page
    assert "pre-decode the dataset into a tensor" in page and "up to 3.26x" in page
    # a bound resting on an assumed fraction says so; a measured one does not
    assert "up to 1.11x, estimated" in page and "up to 3.26x, estimated" not in page
    assert "13.32" in page and "12.73" in page  # --verify's before and after
    assert "abc1234" in page  # provenance: the git SHA


def test_ten_recipe_bench_renders(render, make_bench, png_size):
    out, written = render(make_bench(10, epochs=3))
    _, h10 = png_size((out / "s_per_epoch.png").read_bytes())
    out2, _ = render(make_bench(2, epochs=3), "two")
    _, h2 = png_size((out2 / "s_per_epoch.png").read_bytes())
    assert h10 > h2 + 300  # sized by the number of bars
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == sum(p.suffix == ".png" for p in written)
    assert "a-rather-long-recipe-name-for-labels" in page


def test_multi_rank_bench_adds_the_per_rank_figure(render, make_bench):
    out, written = render(make_bench(2, world_size=2))
    assert "ranks.png" in {p.name for p in written}
    md = (out / "report.md").read_text()
    assert "## Ranks" in md and "| seed-baseline | 1 | 2.300 |" in md


def test_one_epoch_bench_has_no_loss_curve_and_no_evals_no_accuracy_plot(render, make_bench):
    data = make_bench(3, epochs=1, target=None)
    for run in data["runs"]:
        run["evals"] = []
    _, written = render(data)
    assert {p.name for p in written if p.suffix == ".png"} == {"s_per_epoch.png", "breakdown.png"}


def test_files_written_before_the_kind_key_are_recognised(samples):
    for kind in ("bench", "diagnosis", "diagnose-ranks", "tune-loader", "tune-batch-size"):
        legacy = {k: v for k, v in samples[kind].items() if k != "kind"}
        assert build.detect_kind(legacy) == kind


@pytest.mark.parametrize("content, match", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"hello": 1}', "not a looptune results file"),
    ('{"kind": "nonsense"}', "kind='nonsense' is not a kind"),
    ('{"kind": "bench", "schema_version": 1, "runs": [{"recipe": "x"}]}', "incomplete or corrupt"),
])
def test_bad_files_raise_a_data_error_naming_the_file(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataError, match=match) as info:
        build.write_report(path, tmp_path / "out")
    assert "bad.json" in str(info.value)
    assert not (tmp_path / "out").exists()  # nothing written


def test_report_dir_problems(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("")
    assert any("is a file" in p for p in build.report_dir_problems(afile))
    assert build.report_dir_problems(tmp_path / "new" / "deeper") == []


def test_saved_json_is_what_is_rendered(tmp_path, samples):
    text = json.dumps(samples["pack-bench"])
    written = build.save_and_render(text, tmp_path / "rep")
    assert written[0].name == "results.json" and written[0].read_text() == text


def test_the_input_chain_is_a_section_of_the_page_and_lines_in_the_terminal(render, samples):
    import dataclasses

    from rich.console import Console

    from looptune.diagnose.result import Diagnosis
    from looptune.report.diagnose_view import print_diagnosis

    chain = {"cause": "storage", "reason": "12 batches fetched by 2 worker process(es)",
             "links_ms": {"storage": 3.5, "decode": 1.5, "collate": 0.2, "transfer": 2.2,
                          "contention": 0.1},
             "shares": {"storage": 0.47, "decode": 0.2, "collate": 0.03, "transfer": 0.29,
                        "contention": 0.01}, "note": "no /proc here"}
    d = dataclasses.replace(Diagnosis.from_dict(samples["diagnosis"]), data_cause="storage",
                            input_chain=chain)
    out, _ = render(d.to_dict())
    page = (out / "report.html").read_text()
    assert "Input chain" in page and "data cause: storage" in page and "3.500" in page
    assert "Not seen: no /proc here" in page
    console = Console(width=200, record=True)
    print_diagnosis(d, console)
    text = console.export_text()
    assert "data cause: storage: storage 3.500 ms, decode 1.500 ms" in text
    assert "not seen: no /proc here" in text
    assert "(up to 1.11x, estimated: assumed" in text and "(up to 3.26x: data wait" in text


def test_loader_trials_with_loss_parity_keep_the_loss_out_of_their_settings(render, samples,
                                                                           monkeypatch):
    # tune loader with a training step records each trial's mean loss and (after the first) its
    # parity with the first: measurements, not settings (they once made every trial's label
    # "num_workers=0, loss=2.306707931287361", dropped the workers plot and the highlight)
    from looptune.report import tune_sections

    data = samples["tune-loader"]
    data["recommended"]["pin_memory"] = False  # no GPU: decided without a trial of its own
    for i, trial in enumerate(data["trials"]):
        trial["loss"] = 2.3067079 + i * 1e-4
        if i:
            trial["loss_parity"] = i != 3
    drawn = []
    real = tune_sections.plots.hbars
    monkeypatch.setattr(tune_sections.plots, "hbars",
                        lambda bars, **kw: drawn.append(bars) or real(bars, **kw))
    out, written = render(data)
    (bars,) = drawn
    # the recommendation (pin_memory=False, batched reads: the defaults) ran in these two trials
    assert [b.label for b in bars if b.highlight] == ["num_workers=0",
                                                       "num_workers=0, batched=True"]
    assert {p.name for p in written if p.suffix == ".png"} == {"workers.png", "trials.png"}
    page, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    assert "loss=" not in page and "loss_parity" not in page
    assert "| settings | samples/s | loss | loss parity | status | reason |" in md
    assert "| num_workers=0 | 9,068 | 2.307 | baseline | ok |" in md
    assert "| num_workers=0, batched=False | 4,000 | 2.307 | no | ok |" in md


def test_html_tables_sit_in_a_box_that_scrolls_not_the_page(render, samples):
    out, _ = render(samples["tune-batch-size"])
    page = (out / "report.html").read_text()
    assert page.count('<div class="table-wrap"><table>') == page.count("<table>") >= 2
    assert ".table-wrap { overflow-x: auto;" in page
