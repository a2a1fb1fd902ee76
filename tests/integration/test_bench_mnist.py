"""`looptune bench mnist` end to end on the real MNIST, as a user runs it."""

import json
import subprocess
import sys

import pytest

from looptune.presets import DEFAULT_BENCH

pytestmark = pytest.mark.integration

RUN_KEYS = {"recipe", "config", "epochs", "wall_s", "epoch_s", "samples_per_s", "epoch_loss",
            "test_accuracy", "data_wait_fraction", "peak_mem_bytes", "device"}
PROVENANCE_KEYS = {"looptune", "torch", "python", "device", "cpu_count", "git_sha", "date"}


# `looptune bench ...` as the command runs it (cli.main), with the Tensor.item() calls looptune's
# own code makes - a loss read waits for the device - counted per recipe (torch's own, such as
# Adam reading its CPU step counters, are not loss reads). bench looks run_recipe up in its module.
COUNT_ITEMS = """
import json, sys
import torch
from looptune.bench import runner
from looptune.cli.main import main

counts, running, real_item, real_run = {}, [], torch.Tensor.item, runner.run_recipe

def item(self):
    if running and sys._getframe(1).f_globals.get("__name__", "").startswith("looptune."):
        counts[running[-1]] += 1
    return real_item(self)

def run_recipe(workload, recipe, **kw):
    counts.setdefault(recipe.name, 0)
    running.append(recipe.name)
    try:
        return real_run(workload, recipe, **kw)
    finally:
        running.pop()

torch.Tensor.item, runner.run_recipe = item, run_recipe
try:
    code = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as f:
        json.dump(counts, f)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def bench_run(mnist_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    out, items = folder / "results.json", folder / "item_calls.json"
    proc = subprocess.run([sys.executable, "-c", COUNT_ITEMS, str(items), "bench", "mnist",
                           "--epochs", "1", "--data", str(mnist_dir), "--device", "cpu",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    data["item_calls"] = json.loads(items.read_text())
    return proc, data


def test_table_lists_every_recipe_with_its_numbers(bench_run):
    proc, _ = bench_run
    for name in DEFAULT_BENCH:
        assert name in proc.stdout
    for column in ("total s", "s/epoch", "samples/s", "speedup", "loss", "test acc", "data wait",
                   "peak mem"):
        assert column in proc.stdout
    assert "1.00x" in proc.stdout


def test_json_has_provenance_and_every_run(bench_run):
    _, data = bench_run
    assert PROVENANCE_KEYS <= set(data["provenance"])
    assert [run["recipe"] for run in data["runs"]] == list(DEFAULT_BENCH)
    for run in data["runs"]:
        assert RUN_KEYS <= set(run), RUN_KEYS - set(run)
        assert run["epochs"] == 1 and len(run["epoch_s"]) == 1 and len(run["epoch_loss"]) == 1
        assert run["config"]["name"] == run["recipe"] and "loader" in run["config"]
        assert run["samples_per_s"] == pytest.approx(60000 / run["wall_s"])
        assert 0 <= run["data_wait_fraction"] <= 1


def test_every_recipe_learns_the_same_model(bench_run):
    _, data = bench_run
    runs = data["runs"]
    assert len({run["first_loss"] for run in runs}) == 1  # same seed: same weights, same batch
    for run in runs:
        assert 0.93 <= run["test_accuracy"] <= 0.99, run["recipe"]  # ~96% after one epoch
        assert run["test_accuracy"] == pytest.approx(runs[0]["test_accuracy"], abs=0.005)


# looptune's .item() calls in a run besides a per-step loss read: the epoch's loss sum, the
# first loss, the skipped-step count, the test score; far fewer than the 938 steps of an epoch
NOT_PER_STEP = 20


def test_seed_recipes_read_the_loss_every_step_looptune_recipes_do_not(bench_run):
    _, data = bench_run
    sync = {run["recipe"]: run["config"]["loss_sync"] for run in data["runs"]}
    assert sync == {"seed-baseline": "step", "seed-workers": "step", "seed-pinned": "step",
                    "tensorized": "epoch", "device": "epoch"}
    # what the runs did, not what their configs say: .item() calls counted during each run
    calls = data["item_calls"]
    assert set(calls) == set(sync)
    for run in data["runs"]:
        steps, n = run["batches_per_epoch"] * run["epochs"], calls[run["recipe"]]
        if sync[run["recipe"]] == "step":
            assert steps <= n <= steps + NOT_PER_STEP, (run["recipe"], n, steps)
        else:
            assert n <= NOT_PER_STEP, (run["recipe"], n, steps)


def test_data_verb_verifies_the_folder(mnist_dir):
    proc = subprocess.run([sys.executable, "-m", "looptune", "data", "mnist", "--data", str(mnist_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "verified" in proc.stdout


def test_backward_mlp_trains_the_reference_model_bit_for_bit(mnist_dir):
    """step.backward='mlp' on the real MNIST: the same epoch losses and test accuracy as
    autograd, to the last bit (fp32), with the decision saying what ran."""
    import dataclasses

    import looptune
    from looptune.presets import get_recipe

    base = get_recipe("device", "cpu")
    hand = dataclasses.replace(base, name="device-mlp",
                               step=dataclasses.replace(base.step, backward="mlp"))
    a, b = looptune.bench(recipes=[base, hand], epochs=1, device="cpu",
                          data_dir=str(mnist_dir)).runs
    assert a.epoch_loss == b.epoch_loss and a.test_accuracy == b.test_accuracy
    (why,) = [d for d in b.decisions if d["name"] == "step.backward"]
    assert why["value"] == "mlp" and "3 Linear layers" in why["reason"]
