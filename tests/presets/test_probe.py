"""The measured probe behind presets: it picks the fastest candidate on this machine, caches
the result per machine and torch version, and says what it measured."""

import json
import time

import pytest
import torch
from torch import nn

from looptune.presets import probe as probe_mod
from looptune.presets.probe import Candidate, cache_path, probe, probed_settings

CANDIDATES = [Candidate("fused", "fp32", None), Candidate("fused", "fp32", 1)]


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
    same = [Candidate("fused", "fp32", None), Candidate("foreach", "fp32", None)]
    monkeypatch.setattr(probe_mod, "_measure", lambda c, *a: {c[0].name: 1.0, c[1].name: 0.98})
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

    pick = Candidate("fused", "bf16", 1)
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
