
from rich.console import Console

from looptune.bench.results import BenchResults
from looptune.measure.results import RunResult
from looptune.report.render import (
    bench_markdown,
    bench_notes,
    bench_rows,
    bench_table,
    format_bytes,
)


def _run(name, wall, **kw):
    base = dict(recipe=name, config={}, decisions=[], device="cpu", epochs=1, batches_per_epoch=10,
                samples_per_epoch=640, setup_s=0.0, wall_s=wall, epoch_s=[wall],
                samples_per_s=640 / wall, epoch_loss=[0.25], first_loss=2.3, data_wait_s=wall / 2,
                data_wait_fraction=0.5, peak_mem_bytes=3 * 2**20, peak_mem_kind="cpu_peak_rss",
                test_accuracy=0.9612)
    return RunResult(**{**base, **kw})


def _results(*runs):
    return BenchResults(workload="w", epochs=1, seed=0, runs=list(runs),
                        provenance={"device": "cpu", "device_name": "X", "cpu_count": 2, "torch": "t"})


def test_rows_show_speedup_against_the_first_run():
    rows = bench_rows(_results(_run("a", 4.0), _run("b", 1.0)))
    assert rows[0][4] == "1.00x" and rows[1][4] == "4.00x"
    assert rows[0][6] == "baseline" and rows[1][6] == "yes"
    assert rows[1][7] == "96.12%" and rows[1][8] == "50%" and rows[1][9] == "3.0 MiB"


def test_a_faster_recipe_that_stopped_learning_is_flagged_not_just_faster():
    # baseline 2.3 -> 0.25; the fast one ends at 2.1: its 4x is not the same training
    res = _results(_run("a", 4.0), _run("b", 1.0, epoch_loss=[2.1]), _run("c", 2.0,
                                                                          epoch_loss=[0.27]))
    rows = bench_rows(res)
    assert rows[1][6] == "NO (+1.85)" and rows[2][6] == "yes"  # 0.02 < a tenth of 2.05
    notes = bench_notes(res)
    assert any(n.startswith("b: changes the training") and "2.1 vs 0.25" in n for n in notes)
    assert not any(n.startswith("c: changes") for n in notes)
    runs = res.to_dict()["runs"]
    assert runs[0]["loss_parity"] is None and runs[1]["loss_parity"]["parity"] is False
    assert type(res).from_dict(res.to_dict()).loss_parity()[1]["parity"] is False


def test_optional_columns_appear_only_when_measured():
    plain = _results(_run("a", 1.0))
    assert "compile s" not in bench_markdown(plain) and "s to" not in bench_markdown(plain)
    timed = _results(_run("a", 1.0, target_accuracy=0.975, time_to_target_s=0.5),
                     _run("b", 1.0, target_accuracy=0.975, compile_s=3.0))
    text = bench_markdown(timed)
    assert "s to 97.5%" in text and "compile s" in text and "not reached" in text


def test_table_renders_and_notes_carry_reasons():
    run = _run("a", 1.0, decisions=[{"name": "pin_memory", "value": False, "reason": "no GPU"}],
               compile_fallback="torch.compile failed: boom")
    console = Console(width=200, record=True)
    console.print(bench_table(_results(run)))
    assert "a" in console.export_text()
    notes = bench_notes(_results(run))
    assert any("pin_memory=False: no GPU" in n for n in notes)
    assert any("torch.compile failed: boom" in n for n in notes)


def test_format_bytes():
    assert format_bytes(None) == "n/a" and format_bytes(512) == "512 B"
    assert format_bytes(5 * 2**30) == "5.0 GiB"
