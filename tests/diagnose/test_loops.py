"""`looptune diagnose` on loops in the shapes third-party projects write them (tests/diagnose/
loops/: pytorch/examples MNIST, nanoGPT, a streaming IterableDataset, a torch.compile'd model),
run unchanged. Each must be measured, and what the probes cannot see must be said."""

from pathlib import Path

import pytest

import looptune
from loop_checks import loader_vs_step_ms, the_steps_own_verdict
from looptune.diagnose.rules.loading import LOADER_SHARE

LOOPS = Path(__file__).parent / "loops"


def _diagnose(name, *args, steps=8):
    return looptune.diagnose(str(LOOPS / name), list(args), steps=steps, warmup=3)


@pytest.mark.integration
def test_pytorch_examples_mnist_loop(mnist_dir):
    d = _diagnose("pytorch_examples_mnist.py", "--data", str(mnist_dir))
    assert d.steps_measured == 8 and sum(d.shares.values()) == pytest.approx(1.0)
    (ld,) = d.loaders
    assert (ld.dataset, ld.batch_size, ld.num_workers) == ("PerSampleImages", 64, 0)
    assert ld.random_per_sample is False  # ToTensor + Normalize only: deterministic
    # measured apart: a batch of 64 per-sample ToTensor+Normalize reads takes a few ms, the conv
    # net's step ten times that: the loader's share is far under the rule's 30%, so it cannot be
    # the bottleneck, and the verdict is the step's own
    loading, stepping = loader_vs_step_ms(LOOPS / "pytorch_examples_mnist.py",
                                          ["--data", str(mnist_dir)], batches=5)
    assert loading / (loading + stepping) < LOADER_SHARE, (loading, stepping)
    assert 0 < d.shares["data_wait"] < LOADER_SHARE, (d.phase_ms, d.step_s)
    assert d.bottleneck == the_steps_own_verdict(d), d.evidence


def test_nanogpt_loop_without_a_dataloader_says_what_it_cannot_see(tmp_path):
    d = _diagnose("nanogpt_style.py", "--out_dir", str(tmp_path), "--max_iters", "40")
    assert d.steps_measured == 8 and d.loaders == []
    assert d.shares["data_wait"] == 0  # get_batch() is no DataLoader: it lands in compute...
    assert any(f.name == "no_dataloader" for f in d.findings)  # ...and the report says so
    assert d.bottleneck == the_steps_own_verdict(d), d.evidence


def test_streaming_iterable_dataset_loop():
    d = _diagnose("iterable_stream.py", "--records", "20000")
    (ld,) = d.loaders
    assert ld.dataset == "RecordStream" and ld.random_per_sample is None  # no dataset[0]
    # measured apart: decoding 64 records one by one takes longer than the small MLP's step
    loading, stepping = loader_vs_step_ms(LOOPS / "iterable_stream.py", ["--records", "20000"])
    assert loading > stepping, (loading, stepping)
    assert d.bottleneck == "data_loading" and d.shares["data_wait"] > LOADER_SHARE, d.shares
    assert d.evidence["rule"] == "data_loading" and d.evidence["reason"].startswith(
        f"data_wait is {d.shares['data_wait']:.1%} of the step (>= {LOADER_SHARE:.0%} and the largest "
        "phase)")


def test_torch_compiled_model_loop():
    d = _diagnose("compiled_step.py", "--samples", "8192", "--width", "256")
    assert d.steps_measured == 8 and d.loaders[0].dataset == "TensorDataset"
    assert d.bottleneck == the_steps_own_verdict(d), d.evidence
