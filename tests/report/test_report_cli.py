"""`looptune report` and `--report DIR`: render from saved JSON only; bad input exits 2 first."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="reports need matplotlib: pip install 'looptune[plot]'")

from looptune.cli.main import main
from looptune.report import plots

SCRIPTS = Path(__file__).parents[1] / "diagnose" / "scripts"
DATASET = '''
import torch

def tiny():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randint(0, 255, (300, 4, 4), dtype=torch.uint8,
                                                        generator=g), torch.arange(300) % 10)

def floats():
    return torch.utils.data.TensorDataset(torch.randn(256, 16), torch.arange(256) % 10)

def model():
    return torch.nn.Linear(16, 10)
'''


@pytest.fixture
def nothing_runs(monkeypatch):
    """Every entry point that trains or measures fails the test if called."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a report must render from the JSON alone: something ran")

    # by module path: `looptune.bench` and `looptune.diagnose` are also the API's functions
    for module, name in [("engine.loop", "train"), ("bench.runner", "bench"),
                         ("cli.bench", "bench"),
                         ("diagnose.runner", "diagnose"), ("cli.diagnose", "diagnose"),
                         ("tune.loader", "tune_loader"), ("tune.batch", "tune_batch_size"),
                         ("data.pack.throughput", "bench_pack")]:
        monkeypatch.setattr(importlib.import_module(f"looptune.{module}"), name, forbidden)


@pytest.fixture
def no_matplotlib(monkeypatch):
    real = plots.importlib.util.find_spec
    monkeypatch.setattr(plots.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("kind", ["bench", "diagnosis", "diagnose-ranks", "tune-loader",
                                  "tune-batch-size", "pack-bench"])
def test_report_renders_saved_json_without_running_anything(nothing_runs, samples, write_json,
                                                           tmp_path, capsys, kind):
    src = write_json(tmp_path / "results.json", samples[kind])
    code, out, err = _run(capsys, "report", str(src), "--out", str(tmp_path / "rep"))
    assert code == 0, err
    assert "report written to" in out and (tmp_path / "rep" / "report.html").is_file()


@pytest.mark.parametrize("content, problem", [
    ("{truncated", "is not valid JSON"),
    ('{"runs": []}', "not a looptune results file"),
    ('{"kind": "bench", "schema_version": 99, "runs": []}', "schema_version=99 is not supported"),
])
def test_bad_results_file_exits_2_naming_the_problem(nothing_runs, tmp_path, capsys, content,
                                                     problem):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, _, err = _run(capsys, "report", str(bad), "--out", str(tmp_path / "rep"))
    assert code == 2
    assert err.startswith("looptune report: error:") and problem in err and "bad.json" in err
    assert not (tmp_path / "rep").exists()


def test_missing_file_and_out_that_is_a_file_exit_2(tmp_path, capsys):
    code, _, err = _run(capsys, "report", str(tmp_path / "nope.json"), "--out", str(tmp_path / "r"))
    assert code == 2 and "cannot read" in err and "nope.json" in err
    (tmp_path / "f").write_text("")
    code, _, err = _run(capsys, "report", str(tmp_path / "nope.json"), "--out", str(tmp_path / "f"))
    assert code == 2 and "--out" in err and "is a file" in err


def test_missing_matplotlib_names_the_extra(no_matplotlib, samples, write_json, tmp_path, capsys):
    src = write_json(tmp_path / "r.json", samples["pack-bench"])
    code, _, err = _run(capsys, "report", str(src), "--out", str(tmp_path / "rep"))
    assert code == 2 and "pip install 'looptune[plot]'" in err


def test_bench_report_without_matplotlib_fails_before_training(no_matplotlib, nothing_runs,
                                                              tmp_path, capsys):
    code, _, err = _run(capsys, "bench", "mnist", "--epochs", "1", "--data", str(tmp_path),
                        "--report", str(tmp_path / "rep"))
    assert code == 2 and "pip install 'looptune[plot]'" in err


def test_diagnose_report_problems_stop_it_before_the_script_runs(nothing_runs, tmp_path, capsys):
    (tmp_path / "f").write_text("")
    code, _, err = _run(capsys, "diagnose", "--report", str(tmp_path / "f"),
                        str(SCRIPTS / "tiny_sync.py"))
    assert code == 2 and "--report" in err and "is a file" in err


def test_diagnose_report_end_to_end(tmp_path, capsys):
    rep = tmp_path / "rep"
    code, _, err = _run(capsys, "diagnose", "--steps", "20", "--warmup", "2", "--report",
                          str(rep), str(SCRIPTS / "tiny_sync.py"))
    assert code == 0, err
    data = json.loads((rep / "results.json").read_text())
    assert data["kind"] == "diagnosis" and len(data["data_wait_step_s"]) == len(data["step_s"])
    assert 3 <= len(data["warmup_step_s"]) <= 10  # warm-up and the FLOP-counted step
    page = (rep / "report.html").read_text()
    assert f"bottleneck: {data['bottleneck']}" in page
    assert page.count("data:image/png;base64,") == len(list(rep.glob("*.png"))) >= 3


def test_pack_bench_report_end_to_end_and_report_needs_bench(tmp_path, monkeypatch, capsys):
    (tmp_path / "tinyset.py").write_text(DATASET)
    monkeypatch.chdir(tmp_path)
    assert _run(capsys, "pack", "--dataset", "tinyset:tiny", "t.pack")[0] == 0
    code, _, err = _run(capsys, "pack", "--verify", "t.pack", "--report", "rep")
    assert code == 2 and "--report 'rep' goes with --bench" in err
    code, _, err = _run(capsys, "pack", "--bench", "t.pack", "--dataset", "tinyset:tiny",
                          "--batches", "2", "--repeats", "1", "--batch-size", "16",
                          "--report", "rep")
    assert code == 0, err
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {
        "results.json", "pack.png", "report.md", "report.html"}


def test_tune_batch_size_report_end_to_end(tmp_path, monkeypatch, capsys):
    (tmp_path / "tinyset.py").write_text(DATASET)
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "tune", "batch-size", "--dataset", "tinyset:floats", "--model",
                        "tinyset:model", "--budget-s", "3", "--report", "rep", "--json", "t.json")
    assert code == 0, err
    saved = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert saved == json.loads((tmp_path / "t.json").read_text())  # --json and --report agree
    assert saved["kind"] == "tune-batch-size" and saved["provenance"]["device"] == "cpu"
    assert {"batch_throughput.png", "batch_memory.png", "report.html"} <= {
        p.name for p in (tmp_path / "rep").iterdir()}
