import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset, get_worker_info

import looptune
from looptune.tune import loader as tl
from looptune.tune.factory import build_dataset, build_model


def cheap(n=4096):
    return TensorDataset(torch.randn(n, 16), torch.randint(0, 2, (n,)))


class FailsInWorkers(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        if get_worker_info() is not None:
            raise ValueError("planted: this dataset cannot be read in a worker")
        return torch.zeros(16), 0


class HangsInWorkers(FailsInWorkers):
    def __getitem__(self, i):
        if get_worker_info() is not None:
            time.sleep(60)
        return torch.zeros(16), 0


class Batched(Dataset):
    def __init__(self):
        self.x, self.y = torch.randn(4096, 16), torch.randint(0, 2, (4096,))

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, idx):
        return list(zip(self.x[idx], self.y[idx]))


class ScaledInWorkers(Dataset):
    """A read that differs in a worker process (a handle opened lazily, a per-process cache):
    the workers deliver other data, quickly."""

    def __init__(self):
        self.x, self.y = torch.randn(4096, 16), torch.randint(0, 2, (4096,))

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return self.x[i] * (50.0 if get_worker_info() is not None else 1.0), self.y[i]


def test_a_setting_that_delivers_other_data_fails_loss_parity():
    torch.manual_seed(0)
    res = looptune.tune_loader(ScaledInWorkers(), batch_size=64, model=torch.nn.Linear(16, 2),
                               device="cpu", budget_s=30, batches=10, repeats=1, max_workers=1)
    main, worker = res.trials[0], next(t for t in res.trials if t["num_workers"] == 1)
    assert main["status"] == "ok" and main["loss"] > 0 and "loss_parity" not in main
    assert worker["status"] == "failed" and worker["loss_parity"] is False
    assert worker["reason"].startswith("changes the training: the same model's mean loss")
    assert res.recommended["num_workers"] == 0
    # and the same data through a worker keeps parity
    same = looptune.tune_loader(cheap(), batch_size=64, model=torch.nn.Linear(16, 2),
                                device="cpu", budget_s=30, batches=10, repeats=1, max_workers=1)
    one = next(t for t in same.trials if t["num_workers"] == 1)
    assert one["loss_parity"] is True and one["status"] == "ok"


def _kwargs(line):
    call = __import__("ast").parse(line.split("  #")[0], mode="eval").body
    return {k.arg: __import__("ast").literal_eval(k.value) for k in call.keywords}


def test_search_recommends_measured_settings_with_reasons():
    res = looptune.tune_loader(cheap(), batch_size=64, model=torch.nn.Linear(16, 2), device="cpu",
                               budget_s=20, batches=10, repeats=1)
    assert res.trials[0]["num_workers"] == 0 and all(t["samples_per_s"] for t in res.trials)
    names = [d.name for d in res.decisions]
    assert names[0] == "num_workers" and "pin_memory" in names
    assert all(d.reason for d in res.decisions)
    assert res.decisions[0].evidence[0]["samples_per_s"] > 0
    assert _kwargs(res.line) == {"batch_size": 64, "shuffle": True, **res.recommended}
    assert res.end_to_end


def test_the_callers_model_is_untouched():
    model = torch.nn.Linear(16, 2)
    before = [p.detach().clone() for p in model.parameters()]
    looptune.tune_loader(cheap(), model=model, device="cpu", budget_s=10, batches=5, repeats=1, max_workers=0)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_worker_crash_is_a_failed_trial_and_the_search_goes_on():
    res = looptune.tune_loader(FailsInWorkers(), device="cpu", budget_s=30, batches=5, repeats=1,
                               max_workers=1)
    failed = [t for t in res.trials if t["status"] == "failed"]
    assert failed and "planted" in failed[0]["reason"]
    assert res.recommended["num_workers"] == 0 and "failed" in res.decisions[0].reason


def test_a_hung_worker_times_out(monkeypatch):
    monkeypatch.setattr(tl, "WORKER_TIMEOUT_S", 2)
    res = looptune.tune_loader(HangsInWorkers(), device="cpu", budget_s=30, batches=5, repeats=1,
                               max_workers=1)
    hung = [t for t in res.trials if t["num_workers"] == 1][0]
    assert hung["status"] == "failed" and "timed out" in hung["reason"].lower()


def test_batched_reads_are_a_measured_choice():
    res = looptune.tune_loader(Batched(), device="cpu", budget_s=20, batches=5, repeats=1, max_workers=0)
    (batched,) = [d for d in res.decisions if d.name == "batched"]
    assert "per-sample" in batched.reason and batched.evidence["with"]["batched"] is False


def test_bad_arguments_are_reported_together():
    with pytest.raises(looptune.ConfigError) as info:
        looptune.tune_loader([1, 2], batch_size=0, budget_s=0, threshold=2, device="tpu", model="m")
    assert len(info.value.problems) >= 5


def test_factories_report_what_is_wrong(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mydata.py").write_text("def not_a_dataset():\n    return 42\ndef boom():\n    raise OSError('disk')\n")
    with pytest.raises(looptune.ConfigError, match="expected MODULE:FACTORY"):
        build_dataset("mydata")
    with pytest.raises(looptune.ConfigError, match="importing 'nope' failed"):
        build_dataset("nope:make")
    with pytest.raises(looptune.ConfigError, match="returned a int, not a map-style Dataset"):
        build_dataset("mydata:not_a_dataset")
    with pytest.raises(looptune.ConfigError, match="calling it raised OSError: disk"):
        build_model("mydata:boom")


def test_cli_tune_loader_writes_json(tmp_path):
    (tmp_path / "mydata.py").write_text(textwrap.dedent("""
        import torch
        def dataset():
            return torch.utils.data.TensorDataset(torch.randn(2048, 8), torch.randint(0, 2, (2048,)))
        def model():
            return torch.nn.Linear(8, 2)
    """))
    out = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, "-m", "looptune", "tune", "loader", "--dataset", "mydata:dataset",
                           "--model", "mydata:model", "--device", "cpu", "--budget-s", "20",
                           "--json", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "DataLoader(dataset, batch_size=64" in proc.stdout
    data = json.loads(out.read_text())
    assert {"recommended", "decisions", "trials"} <= set(data)
    assert all({"name", "value", "reason", "evidence"} <= set(d) for d in data["decisions"])


def test_cli_bad_specs_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "looptune", "tune", "loader", "--dataset", "nocolon",
                           "--model", "a:1bad"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--dataset 'nocolon' is invalid" in proc.stderr and "--model 'a:1bad' is invalid" in proc.stderr


def test_cli_tune_batch_size_with_keep_effective(tmp_path):
    (tmp_path / "mydata.py").write_text(textwrap.dedent("""
        import torch
        def dataset():
            return torch.utils.data.TensorDataset(torch.randn(1024, 8), torch.randint(0, 2, (1024,)))
        def model():
            return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    """))
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "looptune", "tune", "batch-size", "--dataset", "mydata:dataset",
                           "--model", "mydata:model", "--device", "cpu", "--keep-effective", "512",
                           "--json", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    batch, accumulate = data["recommended"]["batch_size"], data["recommended"]["accumulate"]
    assert batch * accumulate >= 512 and {d["name"] for d in data["decisions"]} == {"batch_size", "accumulate"}
    assert all(t["status"] in {"ok", "oom", "over_memory"} for t in data["trials"])


def test_cli_tune_batch_size_needs_a_model(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "looptune", "tune", "batch-size", "--dataset", "m:d"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "needs --model" in proc.stderr


def test_prefetch_and_persistent_workers_are_measured_choices_once_workers_are_used():
    search = tl._Search(dataset=cheap(1024), batch_size=64, device=torch.device("cpu"), model=None, loss_fn=None, batches=4, warmup=1,
                        repeats=1, threshold=0.03, deadline=float("inf"))
    settings = {"num_workers": 1}
    prefetch = tl._choose_prefetch(search, settings)
    persistent = tl._choose_persistent(search, settings)
    assert prefetch.name == "prefetch_factor" and persistent.name == "persistent_workers"
    for d, tried, default in ((prefetch, 4, 2), (persistent, True, False)):
        with_, without = d.evidence["with"], d.evidence["without"]
        assert with_[d.name] == tried and d.name not in without  # measured both ways
        assert with_["samples_per_s"] and without["samples_per_s"]
        # the value follows what was measured here, whichever way it went on this machine
        pays = with_["samples_per_s"] / without["samples_per_s"] - 1 >= search.threshold
        assert d.value == (tried if pays else default), d.reason
        assert ("kept" in d.reason) == pays and "samples/s" in d.reason
    assert tl._choose_prefetch(search, {"num_workers": 0}) is None  # nothing to prefetch into


# ---------------------------------------------------- the choices, on planted measurements
# Every trial's samples/s is planted (``_Search._rate`` faked: no DataLoader is built, nothing is
# timed), so each test knows the answer the search must give, just above and just below the 3%
# threshold.

def _plant(monkeypatch, workers, *, prefetch=1.0, persistent=1.0, per_sample=1.0,
           losses=None):
    """samples/s = ``workers[num_workers]`` times the factor of each other setting tried
    (``prefetch_factor=4``, ``persistent_workers=True``, ``batched=False``); a worker count
    mapped to an exception fails with it. ``losses(settings)``: the trial's per-batch losses
    (default none: no loss parity to check). Returns the settings of every timed repeat."""
    seen = []

    def rate(self, settings):
        seen.append(dict(settings))
        base = workers[settings.get("num_workers", 0)]
        if isinstance(base, Exception):
            raise base
        factor = ((prefetch if settings.get("prefetch_factor") == 4 else 1.0)
                  * (persistent if settings.get("persistent_workers") else 1.0)
                  * (per_sample if settings.get("batched") is False else 1.0))
        return base * factor, [] if losses is None else losses(settings)

    monkeypatch.setattr(tl._Search, "_rate", rate)
    return seen


def _tune(dataset=None, **kw):
    return looptune.tune_loader(cheap(256) if dataset is None else dataset, batch_size=8,
                                device="cpu", budget_s=600, repeats=1,
                                **{"max_workers": 8, "threshold": 0.03, **kw})


@pytest.mark.parametrize("workers, chosen, tried", [
    ({0: 1000, 1: 1031, 2: 1031 * 1.029}, 1, [0, 1, 2]),  # +3.1% adopted, then +2.9% stops
    ({0: 1000, 1: 1029}, 0, [0, 1]),  # +2.9%: one worker does not pay
    ({0: 1000, 1: 2000, 2: 3000, 4: 3100, 8: 3150}, 4, [0, 1, 2, 4, 8]),  # 1 -> 2 -> 4 -> 8
    ({0: 1000, 1: 900}, 0, [0, 1]),  # slower with a worker
    ({0: 1000, 1: 2000, 2: 4000, 4: 8000, 8: 16000}, 8, [0, 1, 2, 4, 8]),  # max_workers ends it
])
def test_the_worker_count_is_the_last_step_up_that_gained_the_threshold(
        monkeypatch, workers, chosen, tried):
    _plant(monkeypatch, workers)
    res = _tune()
    assert res.recommended["num_workers"] == chosen
    (decision,) = [d for d in res.decisions if d.name == "num_workers"]
    assert decision.value == chosen
    assert [t["num_workers"] for t in decision.evidence] == tried
    assert [t["samples_per_s"] for t in decision.evidence] == [workers[k] for k in tried]
    rate = f"{chosen} workers: {workers[chosen]:,.0f} samples/s (loading only); "
    if chosen == tried[-1]:
        assert decision.reason == rate + "the budget or the bound ended the search"
    else:
        nxt = tried[tried.index(chosen) + 1]
        change = workers[nxt] / workers[chosen] - 1
        assert decision.reason == rate + f"{nxt} gave {change:+.1%} (< 3% threshold)"


def test_the_threshold_is_the_callers(monkeypatch):
    _plant(monkeypatch, {0: 1000, 1: 1080, 2: 1080 * 1.04, 4: 1080 * 1.04})
    assert _tune(threshold=0.1).recommended["num_workers"] == 0  # +8% < 10%
    assert _tune(threshold=0.05).recommended["num_workers"] == 1  # +8% >= 5%, then +4% < 5%
    assert _tune(threshold=0.03).recommended["num_workers"] == 2


def test_a_faster_worker_count_that_fails_is_not_adopted(monkeypatch):
    _plant(monkeypatch, {0: 1000, 1: 1500, 2: RuntimeError("planted: worker 0 died")})
    res = _tune()
    assert res.recommended["num_workers"] == 1
    assert res.decisions[0].reason.startswith("1 workers: 1,500 samples/s; 2 failed (")
    assert "planted: worker 0 died" in res.decisions[0].reason


def test_a_faster_worker_count_that_delivers_other_data_is_not_adopted(monkeypatch):
    # 50% faster through a worker, but its batches give the same lr-0 model another loss
    _plant(monkeypatch, {0: 1000, 1: 1500, 2: 1500},
           losses=lambda s: [2.3] * 10 if s["num_workers"] == 0 else [5.0] * 10)
    res = _tune()
    assert res.recommended["num_workers"] == 0
    one = next(t for t in res.trials if t["num_workers"] == 1)
    assert one["status"] == "failed" and one["loss_parity"] is False
    assert "changes the training" in res.decisions[0].reason


def _decision(res, name):
    (d,) = [d for d in res.decisions if d.name == name]
    return d


@pytest.mark.parametrize("factor, kept", [(1.031, True), (1.029, False), (0.8, False)])
def test_prefetch_4_is_kept_only_when_it_gains_the_threshold(monkeypatch, factor, kept):
    _plant(monkeypatch, {0: 1000, 1: 2000, 2: 2000}, prefetch=factor)
    res = _tune()
    d = _decision(res, "prefetch_factor")
    assert d.value == (4 if kept else 2) and res.recommended["prefetch_factor"] == d.value
    assert d.evidence["with"]["prefetch_factor"] == 4
    assert d.evidence["with"]["samples_per_s"] == pytest.approx(2000 * factor)
    assert d.evidence["without"]["samples_per_s"] == 2000
    assert d.reason == (f"prefetch_factor=4 instead of 2: {factor - 1:+.1%} ("
                        f"{2000 * factor:,.0f} vs 2,000 samples/s); "
                        + ("kept" if kept else "below the 3% threshold, not worth it"))
    assert f"prefetch_factor={d.value}" in res.line


@pytest.mark.parametrize("factor, kept", [(1.031, True), (1.029, False)])
def test_persistent_workers_are_kept_only_when_they_gain_the_threshold(monkeypatch, factor,
                                                                       kept):
    _plant(monkeypatch, {0: 1000, 1: 2000, 2: 2000}, prefetch=1.05, persistent=factor)
    res = _tune()
    d = _decision(res, "persistent_workers")
    assert d.value is kept and res.recommended["persistent_workers"] is kept
    # measured on top of the prefetch depth just chosen (4: +5%)
    assert d.evidence["without"] == next(t for t in res.trials if t.get("prefetch_factor") == 4)
    assert d.evidence["with"]["samples_per_s"] == pytest.approx(2000 * 1.05 * factor)
    assert ("; kept" in d.reason) is kept


def test_a_faster_setting_that_fails_is_not_kept(monkeypatch):
    _plant(monkeypatch, {0: 1000, 1: 2000, 2: 2000}, prefetch=1.5,
           losses=lambda s: [5.0] * 10 if s.get("prefetch_factor") == 4 else [2.3] * 10)
    res = _tune()
    d = _decision(res, "prefetch_factor")
    assert d.value == 2 and d.evidence["with"]["status"] == "failed"
    assert d.reason.startswith("prefetch_factor=4 instead of 2 failed: changes the training")


def test_prefetch_and_persistence_are_not_measured_without_workers(monkeypatch):
    seen = _plant(monkeypatch, {0: 1000, 1: 900})
    res = _tune()
    assert {d.name for d in res.decisions} == {"num_workers", "pin_memory"}
    assert res.recommended == {"num_workers": 0, "pin_memory": False}
    assert seen == [{"num_workers": 0}, {"num_workers": 1}]


@pytest.mark.parametrize("factor, kept", [(1.031, True), (1.029, False)])
def test_per_sample_reads_replace_batched_ones_only_when_they_gain_the_threshold(
        monkeypatch, factor, kept):
    _plant(monkeypatch, {0: 1000, 1: 900}, per_sample=factor)
    res = _tune(Batched())
    d = _decision(res, "batched")
    assert d.value is (not kept)
    assert ("batched" in res.recommended) is kept  # only the change is recommended
    assert res.line.endswith("  # wrap the dataset to drop __getitems__") is kept


@pytest.mark.parametrize("balanced, chosen", [(1200, 1), (850, 0)])
def test_with_a_cpu_step_the_workers_are_also_measured_beside_fewer_step_threads(
        monkeypatch, balanced, chosen):
    # issue 33 (a JPEG folder on 2 cores): one worker beside a 2-thread step measured -8%, the
    # same worker beside a 1-thread step +10-36%: both are measured, the faster kept
    monkeypatch.setattr(tl.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    seen = _plant(monkeypatch, {0: 1000, 1: 900, 2: 800})
    original = tl._Search._rate

    def rate(self, settings):
        if settings.get("intra_op_threads") == 1:
            seen.append(dict(settings))
            return balanced, []
        return original(self, settings)

    monkeypatch.setattr(tl._Search, "_rate", rate)
    res = _tune(model=torch.nn.Linear(4, 3), max_workers=2)
    assert {"num_workers": 1, "intra_op_threads": 1} in [
        {k: t[k] for k in ("num_workers", "intra_op_threads") if k in t} for t in res.trials]
    assert res.recommended["num_workers"] == chosen and "intra_op_threads" not in res.recommended
    if chosen:
        assert res.threads == 1 and res.line.endswith("# and torch.set_num_threads(1) in the training process")
        (d,) = [d for d in res.decisions if d.name == "intra_op_threads"]
        assert d.value == 1 and "1,200 samples/s with 1 worker(s) vs 900 with its 2 threads" in d.reason
        later = [s for s in seen if s.get("prefetch_factor") == 4]  # the later choices keep it
        assert later and all(s.get("intra_op_threads") == 1 for s in later)
    else:
        assert res.threads is None and "set_num_threads" not in res.line
        assert not [d for d in res.decisions if d.name == "intra_op_threads"]
