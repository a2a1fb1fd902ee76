"""The measured probe behind presets: it picks the fastest candidate on this machine, caches
the result per machine and torch version, and says what it measured."""

import json
import time

import pytest
import torch
from torch import nn

from looptune.presets import probe as probe_mod
from looptune.presets.probe import Candidate, cache_path, probe, probed_settings

CANDIDATES = [Candidate(impl="fused", precision="fp32", threads=None), Candidate(impl="fused", precision="fp32", threads=1)]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPTUNE_PROBE_CACHE", str(tmp_path / "probes.json"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOOPTUNE_PROBE", raising=False)
    monkeypatch.setattr(probe_mod, "ROUND_S", 0.03)


class SlowUnlessOneThread:
    """A loss that costs 3 ms more per step unless torch runs one intra-op thread: the planted
    difference the probe must find."""

    calls = 0

    def __call__(self, out, y):
        SlowUnlessOneThread.calls += 1
        if torch.get_num_threads() != 1:
            time.sleep(0.003)
        return nn.functional.cross_entropy(out, y)


def _batch(n, device):
    return torch.randn(n, 8, device=device), torch.randint(0, 3, (n,), device=device)


def _kwargs(**kw):
    return dict(workload="toy", batch_size=4, candidates=CANDIDATES,
                build_model=lambda: nn.Linear(8, 3), loss_fn=SlowUnlessOneThread(),
                make_batch=_batch, **kw)


@pytest.mark.skipif(torch.get_num_threads() == 1, reason="needs more than one torch thread")
def test_the_probe_picks_the_measurably_faster_candidate_and_caches_it():
    threads = torch.get_num_threads()
    first = probe(**_kwargs(device=torch.device("cpu")))
    assert first.chosen == CANDIDATES[1] and not first.cached
    assert first.seconds[CANDIDATES[0].name] > first.seconds[CANDIDATES[1].name] + 0.002
    assert torch.get_num_threads() == threads  # restored after the probe
    stored = json.loads(cache_path().read_text())
    assert len(stored) == 1 and "toy batch 4" in next(iter(stored))
    SlowUnlessOneThread.calls = 0
    again = probe(**_kwargs(device=torch.device("cpu")))
    assert again.cached and again.chosen == first.chosen and SlowUnlessOneThread.calls == 0
    assert "cached from" in again.evidence() and "1 thread(s)" in again.evidence()
    assert probe(**_kwargs(device=torch.device("cpu")), refresh=True).cached is False


def test_another_torch_version_or_batch_size_is_probed_again(monkeypatch):
    probe(**_kwargs(device=torch.device("cpu")))
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert probe(**_kwargs(device=torch.device("cpu"))).cached is False
    kw = _kwargs(device=torch.device("cpu"))
    kw["batch_size"] = 8
    assert probe(**kw).cached is False
    assert len(json.loads(cache_path().read_text())) == 3


def test_a_candidate_within_the_noise_does_not_replace_the_plain_one(monkeypatch):
    same = [Candidate(impl="fused", precision="fp32", threads=None), Candidate(impl="foreach", precision="fp32", threads=None)]
    monkeypatch.setattr(probe_mod, "_measure", lambda c, *a: ({c[0].name: 1.0, c[1].name: 0.98}, []))
    result = probe(**{**_kwargs(device=torch.device("cpu")), "candidates": same})
    assert result.chosen == same[0]  # 2% faster: under the 3% a change must win by


def test_a_corrupt_cache_file_is_probed_again_and_rewritten():
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text("{not json")
    assert probe(**_kwargs(device=torch.device("cpu"))).cached is False
    assert json.loads(cache_path().read_text())


def test_looptune_probe_0_keeps_the_plain_setting_and_says_so(monkeypatch):
    monkeypatch.setenv("LOOPTUNE_PROBE", "0")
    kw = _kwargs()
    chosen, why = probed_settings(**kw)
    assert chosen == CANDIDATES[0] and "LOOPTUNE_PROBE=0" in why
    assert not cache_path().exists()


def test_ranks_never_probe_but_read_a_cached_result(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    chosen, why = probed_settings(**_kwargs())
    assert chosen == CANDIDATES[0] and "several ranks" in why and not cache_path().exists()
    monkeypatch.setenv("WORLD_SIZE", "1")
    measured, _ = probed_settings(**_kwargs())
    monkeypatch.setenv("WORLD_SIZE", "2")
    cached, why = probed_settings(**_kwargs())
    assert cached == measured and "cached from" in why


def test_the_fast_preset_takes_the_probed_settings_with_the_evidence(monkeypatch):
    from looptune.presets import get_recipe
    from looptune.presets import mnist

    pick = Candidate(impl="fused", precision="bf16", threads=1)
    monkeypatch.setattr(mnist, "cpu_step_settings", lambda b, c=None: (pick, f"planted at batch {b}"))
    fast = get_recipe("fast", "cpu")
    assert (fast.step.precision, fast.optim.impl, fast.cpu_threads) == ("bf16", "fused", 1)
    assert any("planted at batch 64" in d.reason for d in fast.reasons)


def test_looptune_probe_refresh_measures_again(monkeypatch):
    probed_settings(**_kwargs())
    SlowUnlessOneThread.calls = 0
    probed_settings(**_kwargs())
    assert SlowUnlessOneThread.calls == 0  # cached
    monkeypatch.setenv("LOOPTUNE_PROBE", "refresh")
    probed_settings(**_kwargs())
    assert SlowUnlessOneThread.calls > 0


def test_an_unknown_looptune_probe_value_is_refused_naming_it(monkeypatch):
    from looptune.errors import ConfigError

    monkeypatch.setenv("LOOPTUNE_PROBE", "sometimes")
    with pytest.raises(ConfigError, match="LOOPTUNE_PROBE='sometimes' is invalid: use 1"):
        probed_settings(**_kwargs())
    assert not cache_path().exists()


# ------------------------------------------------ the choice, on planted step times
# ``_measure`` faked: each candidate's seconds per step are planted, so the test knows the
# answer, just above and just below the 3% a candidate must win by.

FOUR = [Candidate(impl="direct", precision="fp32", threads=None), Candidate(impl="direct", precision="fp32", threads=1),
        Candidate(impl="direct", precision="bf16", threads=None), Candidate(impl="fused", precision="fp32", threads=None, backward="mlp")]


def _plant(monkeypatch, seconds):
    calls = []

    def measure(candidates, *rest):
        calls.append([c.name for c in candidates])
        return {c.name: s for c, s in zip(candidates, seconds)}, []

    monkeypatch.setattr(probe_mod, "_measure", measure)
    return calls


@pytest.mark.parametrize("seconds, chosen", [
    ([1.0, 0.969], 1),  # 3.1% faster than the plain one: taken
    ([1.0, 0.971], 0),  # 2.9%: within the noise, the plain one stays
    ([1.0, 1.3], 0),  # slower
    ([1.0, 0.90, 0.80, 0.95], 2),  # the fastest, not the first that beats the plain one
    ([1.0, 0.96, 0.985, 1.2], 1),
    ([0.5, 0.6, 0.7, 0.485], 3),  # the last one, 3% faster
    ([0.5, 0.6, 0.7, 0.486], 0),  # the last one, 2.8% faster: the plain one stays
])
def test_the_probe_takes_the_fastest_candidate_only_when_3_percent_faster(monkeypatch, seconds,
                                                                           chosen):
    assert probe_mod.WIN == 0.03
    cands = FOUR[:len(seconds)]
    calls = _plant(monkeypatch, seconds)
    result = probe(**{**_kwargs(device=torch.device("cpu")), "candidates": cands})
    assert result.chosen == cands[chosen] and not result.cached
    assert result.seconds == {c.name: s for c, s in zip(cands, seconds)}
    first = seconds[0]
    for c, s in zip(cands, seconds):  # every candidate's figure, against the plain one
        assert f"{c.name} {s * 1e6:.0f} us ({first / s:.2f}x)" in result.evidence()
    again = probe(**{**_kwargs(device=torch.device("cpu")), "candidates": cands})
    assert again.cached and again.chosen == cands[chosen] and len(calls) == 1  # remembered


@pytest.mark.parametrize("seconds, want", [
    ([300e-6, 290e-6, 200e-6, 310e-6, 280e-6, 250e-6, 260e-6, 240e-6],
     ("direct", "bf16", None, "autograd")),
    ([300e-6, 290e-6, 310e-6, 310e-6, 280e-6, 250e-6, 260e-6, 291.5e-6],
     ("direct", "bf16", None, "mlp")),
    ([300e-6, 292e-6, 310e-6, 310e-6, 295e-6, 330e-6, 320e-6, 340e-6],
     ("direct", "fp32", None, "autograd")),  # 2.7% at best: the plain setting
])
def test_the_fast_preset_is_built_from_the_probes_choice(monkeypatch, seconds, want):
    from looptune.presets import get_recipe
    from looptune.presets import mnist

    assert len(seconds) == len(mnist.CPU_CANDIDATES)
    _plant(monkeypatch, seconds)
    fast = get_recipe("fast", "cpu")
    chosen = (fast.optim.impl, fast.step.precision, fast.cpu_threads, fast.step.backward)
    assert chosen == want
    assert fast.loader.store == ("float32" if want[1] == "fp32" else "autocast")
    (why,) = [d for d in fast.reasons if d.name == "optim.impl/precision/cpu_threads"]
    assert why.value == Candidate(**dict(zip(('impl', 'precision', 'threads', 'backward'), want))).name and "the fastest step at batch 64" in why.reason


def test_a_candidate_far_slower_in_its_warm_up_is_not_timed_further(monkeypatch):
    # bf16 autocast on a CPU without native bf16 ran a small GPT's step 19x slower than fp32 (a
    # Zen 3 VM): its warm-up figure decides, and the evidence says that is all it was timed for
    calls = {"slow": 0}

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 3)

        def forward(self, x):
            if x.dtype == torch.float32 and torch.is_autocast_cpu_enabled():
                calls["slow"] += 1
                time.sleep(0.02)
            return self.lin(x)

    cands = [Candidate(impl="foreach", precision="fp32"),
             Candidate(impl="foreach", precision="bf16")]
    result = probe(**{**_kwargs(device=torch.device("cpu")), "candidates": cands,
                      "build_model": Slow, "loss_fn": nn.functional.cross_entropy})
    assert result.chosen == cands[0] and result.warm_only == (cands[1].name,)
    assert calls["slow"] <= 3  # its warm-up round only (a timed round adds 4 or more)
    assert result.seconds[cands[1].name] >= 0.02
    assert "its warm-up steps only: >= 2x the plain one's" in result.evidence()
    again = probe(**{**_kwargs(device=torch.device("cpu")), "candidates": cands,
                     "build_model": Slow, "loss_fn": nn.functional.cross_entropy})
    assert again.cached and again.warm_only == result.warm_only  # the cache keeps it


def test_a_channels_last_candidate_times_an_nhwc_model_and_input(monkeypatch):
    """The candidate runs as the engine runs it: weights and the 4-D input in channels_last."""
    from looptune.engine import step as step_mod
    from looptune.models import SmallCNN

    seen = []
    real = step_mod.Stepper.__call__

    def spy(self, x, y):
        conv = self.model.features[3].weight  # 16 x 8 x 3 x 3: NCHW and NHWC differ
        seen.append((self.cfg.channels_last, conv.is_contiguous(memory_format=torch.channels_last)))
        return real(self, x, y)

    monkeypatch.setattr(step_mod.Stepper, "__call__", spy)
    cands = [Candidate(impl="fused", precision="fp32"),
             Candidate(impl="fused", precision="fp32", channels_last=True)]
    assert cands[1].name == "fused fp32 all threads channels_last"
    result = probe(workload="t-cnn", batch_size=8, candidates=cands, build_model=SmallCNN,
                   loss_fn=torch.nn.functional.cross_entropy, device=torch.device("cpu"),
                   make_batch=lambda n, d: (torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))))
    assert set(result.seconds) == {c.name for c in cands}
    assert (True, True) in seen and (False, False) in seen
