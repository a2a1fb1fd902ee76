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
    search = tl._Search(cheap(1024), 64, torch.device("cpu"), None, None, batches=4, warmup=1,
                        repeats=1, threshold=0.03, deadline=float("inf"))
    settings = {"num_workers": 1}
    prefetch = tl._choose_prefetch(search, settings)
    persistent = tl._choose_persistent(search, settings)
    assert prefetch.name == "prefetch_factor" and prefetch.value in (2, 4)
    assert persistent.name == "persistent_workers" and persistent.value in (True, False)
    for d in (prefetch, persistent):
        assert d.evidence["with"]["samples_per_s"] and d.evidence["without"]["samples_per_s"]
        assert "samples/s" in d.reason
    assert tl._choose_prefetch(search, {"num_workers": 0}) is None  # nothing to prefetch into
