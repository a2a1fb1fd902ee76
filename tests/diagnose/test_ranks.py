"""Distributed diagnose: merging the ranks' diagnoses (pure), their hand-over files, the timing of
collectives, and the CLI end to end (--nproc 2 on gloo; torchrun's rank-0 report in process)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from rich.console import Console

from looptune.diagnose import rank_files
from looptune.diagnose.collectives import RankWaits
from looptune.measure.records import PHASES, LoaderInfo
from looptune.diagnose.rules.records import Finding, Remedy
from looptune.diagnose.ranks import merge_ranks
from looptune.diagnose.result import Diagnosis
from looptune.errors import ConfigError, MeasurementError
from looptune.report.diagnose_view import print_rank_report

SCRIPTS = Path(__file__).parent / "scripts"
STRAGGLER = SCRIPTS / "ddp_straggler.py"


def _diag(rank: int | None, step_ms: float, wait_ms: float | None = None, *, n: int = 9,
          world: int | None = 2, **kw) -> Diagnosis:
    """A diagnosis as a rank writes it: n steps of ``step_ms``, ``wait_ms`` in collectives."""
    shares = {"data_wait": 0.1, "host_to_device": 0.0, "sync": 0.0, "compute": 0.9, "other": 0.0}
    base = {
        "bottleneck": "compute", "shares": shares, "step_ms": step_ms,
        "phase_ms": {k: v * step_ms for k, v in shares.items()}, "steps_measured": n,
        "steps_requested": n, "warmup_steps": 2, "evidence": {"rule": "compute"},
        "findings": [Finding(name="tiny_batch", severity="info", message="batch_size=4 ...")],
        "remedies": [Remedy(action="bf16 autocast", expected_speedup=1.2, reason="...",
                            kind="precision")],
        "loaders": [LoaderInfo(batch_size=32, num_workers=0, pin_memory=False,
                               prefetch_factor=None, persistent_workers=False,
                               dataset="TensorDataset")],
        "step_s": [step_ms / 1e3] * n, "peak_mem_bytes": 300 * 2**20,
        "peak_mem_kind": "cpu_peak_rss", "script": "train.py", "stopped": "steps", "rank": rank,
        "world_size": None if rank is None else world,
        "wait_s": None if wait_ms is None else [wait_ms / 1e3] * n}
    return Diagnosis(**{**base, **kw})


# --- merge_ranks ---------------------------------------------------------------------------------

def test_a_synchronized_straggler_is_found_by_own_time_not_step_time():
    # DDP: both ranks' steps take 10 ms; rank 0 spends 6 of them waiting in the all-reduce
    fast, slow = _diag(0, 10.0, wait_ms=6.0), _diag(1, 10.0, wait_ms=1.0)
    report = merge_ranks([slow, fast])  # any order
    assert [r.rank for r in report.rows] == [0, 1] and [d.rank for d in report.ranks] == [0, 1]
    assert report.slowest_rank == 1 and report.fastest_rank == 0 and report.slowest is slow
    assert report.compared_by == "own_ms" and report.slowdown == pytest.approx(9 / 4)
    assert not report.balanced and report.missing_ranks == [] and report.world_size == 2
    row0 = report.rows[0]
    assert row0.own_ms == pytest.approx(4.0) and row0.wait_ms == pytest.approx(6.0)
    # the wait is taken out of compute (the probes count a blocked host as compute on the CPU)
    assert row0.shares["collectives"] == pytest.approx(0.6)
    assert row0.shares["compute"] == pytest.approx(0.3)
    assert sum(row0.shares.values()) == pytest.approx(1.0)
    assert "rank 1 9.000 ms vs rank 0 4.000 ms, 2.25x (+125%)" in report.reason
    assert "rank 0 spends 6.000 ms per step in collectives" in report.reason


def test_without_measured_waits_the_median_step_time_decides_and_says_so():
    report = merge_ranks([_diag(0, 10.0), _diag(1, 12.5), _diag(2, 11.0)], world_size=3)
    assert report.slowest_rank == 1 and report.fastest_rank == 0
    assert report.compared_by == "step_ms" and report.slowdown == 1.25
    assert all(r.own_ms is None and "collectives" not in r.shares for r in report.rows)
    assert "not measured on rank(s) [0, 1, 2]" in report.reason


def test_balanced_ranks_are_called_balanced():
    report = merge_ranks([_diag(0, 10.0, 2.0), _diag(1, 10.0, 1.8)])
    assert report.slowdown < 1.05 and report.balanced and "balanced" in report.reason


def test_missing_ranks_positions_and_a_single_rank():
    report = merge_ranks([_diag(2, 5.0, 0.0, world=4), _diag(0, 6.0, 0.0, world=4)])
    assert report.world_size == 4 and report.missing_ranks == [1, 3] and report.slowest_rank == 0
    unranked = merge_ranks([_diag(None, 5.0), _diag(None, 7.0)])  # no launcher: positions
    assert [r.rank for r in unranked.rows] == [0, 1] and unranked.slowest_rank == 1
    one = merge_ranks([_diag(0, 5.0, 1.0, world=1)])
    assert one.slowest_rank == one.fastest_rank == 0 and one.slowdown == 1.0
    assert "only rank 0 reported" in one.reason


@pytest.mark.parametrize(("diagnoses", "kwargs", "message"), [
    ([], {}, "no rank diagnoses to merge: got an empty list"),
    ([_diag(1, 5.0), _diag(1, 6.0)], {}, r"rank\(s\) \[1\] given more than once"),
    ([_diag(0, 5.0), _diag(None, 6.0)], {}, r"positions \[1\] have no rank"),
    ([_diag(0, 5.0), _diag(3, 6.0)], {}, r"rank\(s\) \[3\] are outside 0..1 for world_size=2"),
    ([_diag(0, 5.0)], {"world_size": 0}, "world_size=0 is invalid: must be an integer >= 1"),
])
def test_bad_input_names_the_value_and_the_fix(diagnoses, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        merge_ranks(diagnoses, **kwargs)


def test_the_combined_record_is_json_with_every_rank(tmp_path):
    report = merge_ranks([_diag(0, 10.0, 6.0), _diag(1, 10.0, 1.0)])
    report.write_json(tmp_path / "all.json")
    data = json.loads((tmp_path / "all.json").read_text())
    assert data["world_size"] == 2 and data["slowest_rank"] == 1 and data["compared_by"] == "own_ms"
    assert [d["rank"] for d in data["ranks"]] == [0, 1] and data["ranks"][0]["wait_s"]
    assert Diagnosis.from_dict(data["ranks"][1]) == report.ranks[1]  # a rank reads back whole


def test_the_rank_report_renders_a_row_per_rank_and_the_slowest():
    console = Console(record=True, width=160)
    print_rank_report(merge_ranks([_diag(0, 10.0, 6.0), _diag(1, 10.0, 1.0, error="boom [x]")]),
                      console)
    text = console.export_text()
    assert "2 of 2 rank(s) reported" in text and "collectives" in text and "own ms" in text
    assert "1 (slowest)" in text and "slowest rank: 1 (2.25x rank 0, the fastest)" in text
    assert "rank 1's script raised: boom [x]" in text and "full diagnosis of rank 1" in text


# --- rank files and Diagnosis JSON ---------------------------------------------------------------

def test_rank_files_round_trip_and_a_bounded_wait(tmp_path):
    d = _diag(1, 8.0, 2.0)
    assert rank_files.write_rank(tmp_path, d) == tmp_path / "rank-1.json"
    found, missing = rank_files.wait_for_ranks(tmp_path, [0, 1], timeout_s=0.3, poll_s=0.05)
    assert found == [d] and missing == [0]
    with pytest.raises(ConfigError, match="has no rank"):
        rank_files.write_rank(tmp_path, _diag(None, 8.0))


def test_a_file_that_is_not_a_diagnosis_is_named(tmp_path):
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"bottleneck": "compute"}')
    with pytest.raises(MeasurementError, match=r"rank-0.json.*not a diagnosis record"):
        Diagnosis.read_json(bad)
    bad.write_text("{cut short")
    with pytest.raises(MeasurementError, match="cannot read the diagnosis"):
        Diagnosis.read_json(bad)


def test_node_ranks_and_the_torchrun_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "TORCHELASTIC_RUN_ID": "job/42"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert rank_files.node_ranks() == [4, 5, 6, 7]  # node 1 of 2
    folder = rank_files.torchrun_folder()
    assert folder.is_dir() and folder.parent == tmp_path and "job_42" in folder.name
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(ConfigError, match="LOCAL_RANK='one' is not an integer"):
        rank_files.node_ranks()


# --- timing collectives (a one-rank gloo group, in this process) ---------------------------------

@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    yield dist
    dist.destroy_process_group()


def _train_ddp(waits: RankWaits, hook=None, steps: int = 6) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    with waits:
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 2)))
        if hook is not None:
            model.register_comm_hook(None, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            waits.end_step()
    return [p.detach().clone() for p in model.parameters()]


def test_the_timing_hook_keeps_gradients_and_times_every_step(one_rank_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    originals = (DDP.__init__, DDP.register_comm_hook, one_rank_group.all_reduce)
    plain = _train_ddp(RankWaits(enabled=False))
    waits = RankWaits(enabled=True)
    timed = _train_ddp(waits)
    assert all(torch.equal(a, b) for a, b in zip(plain, timed))
    assert len(waits.per_step) == 6 and all(0 <= w < 1 for w in waits.per_step)
    assert (DDP.__init__, DDP.register_comm_hook, one_rank_group.all_reduce) == originals


def test_blocking_collectives_count_and_async_ones_do_not(one_rank_group):
    with RankWaits(enabled=True) as waits:
        one_rank_group.barrier()
        waits.end_step()
        one_rank_group.all_reduce(torch.ones(4), async_op=True).wait()
        waits.end_step()
    assert waits.per_step[0] > 0 and waits.per_step[1] == 0
    assert RankWaits(enabled=False).per_step is None  # one process: nothing to wait for


def test_a_hook_the_script_registers_still_runs_timed(one_rank_group):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = []

    def mine(state, bucket):
        calls.append(state)
        return allreduce_hook(None, bucket)

    waits = RankWaits(enabled=True)
    _train_ddp(waits, hook=mine, steps=3)
    assert len(calls) == 3 and len(waits.per_step) == 3


# --- the CLI -------------------------------------------------------------------------------------

def _cli(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "looptune", "diagnose", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False, **kw)


def test_nproc_2_names_each_rank_and_the_straggler(tmp_path):
    out = tmp_path / "ranks.json"
    proc = _cli("--nproc", 2, "--steps", 20, "--warmup", 3, "--json", out, STRAGGLER,
                "--delay-ms", 5)
    assert proc.returncode == 0, proc.stderr
    assert "2 of 2 rank(s) reported" in proc.stdout and "1 (slowest)" in proc.stdout
    assert "slowest rank: 1" in proc.stdout and "full diagnosis of rank 1" in proc.stdout
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["slowest_rank"] == 1
    assert [d["rank"] for d in data["ranks"]] == [0, 1]
    assert data["compared_by"] == "own_ms" and data["slowdown"] > 1.5  # 5 ms on a ~2 ms step
    assert all(d["steps_measured"] == 20 and d["script"].endswith("--delay-ms 5")
               for d in data["ranks"])


def test_nproc_a_failing_rank_reports_what_the_ranks_wrote():
    proc = _cli("--nproc", 2, "--steps", 30, "--warmup", 3, STRAGGLER, "--fail-rank", 1)
    assert proc.returncode == 1, proc.stderr
    assert "planted failure on rank 1 at step 12" in proc.stdout
    assert "rank 1: exit code 1" in proc.stderr  # the launcher names the failed rank


def test_nproc_bad_input_exits_2_before_launching(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    proc = _cli("--nproc", 0, script, timeout=120)
    assert proc.returncode == 2 and not marker.exists()
    assert "--nproc 0 is invalid: must be an integer >= 1" in proc.stderr
    proc = _cli("--nproc", 2, "--verify", "--seconds", 5, script, timeout=120)
    assert proc.returncode == 2 and not marker.exists()
    assert "--verify cannot rerun a distributed script" in proc.stderr
    assert "--seconds 5.0 would stop the ranks" in proc.stderr


def test_under_torchrun_rank_0_reports_every_rank(monkeypatch, tmp_path, capsys):
    from looptune.cli.main import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                 "TORCHELASTIC_RUN_ID": "t1"}.items():
        monkeypatch.setenv(k, v)
    folder = rank_files.torchrun_folder()
    rank_files.write_rank(folder, _diag(1, 50.0, 0.5, script=f"{SCRIPTS / 'tiny_sync.py'}"))
    code = main(["diagnose", "--steps", "5", "--warmup", "1", str(SCRIPTS / "tiny_sync.py")])
    out = capsys.readouterr().out
    assert code == 0 and "2 of 2 rank(s) reported" in out and "slowest rank: 1" in out
    assert not folder.exists()  # read, then cleaned up

    monkeypatch.setattr(rank_files, "RANK_WAIT_S", 0.2)
    code = main(["diagnose", "--steps", "5", "--warmup", "1", str(SCRIPTS / "tiny_sync.py")])
    captured = capsys.readouterr()
    assert code == 1 and "1 of 2 rank(s) reported" in captured.out
    assert "ranks [1] wrote no diagnosis" in captured.err


def test_diagnosis_round_trips_through_json(tmp_path):
    d = _diag(0, 3.0, 1.0, verify={"remedy": None}, trace=None)
    d.write_json(tmp_path / "d.json")
    assert Diagnosis.read_json(tmp_path / "d.json") == d
    assert set(PHASES) <= set(dataclasses.asdict(d)["shares"])
