"""Which link of the input chain starves the step (diagnose.rules.chain), on hand-built chains
through analyze(): each cause named from its numbers, its own remedy with its bound, contention
inside the step as a finding, and nothing claimed when the chain was not seen."""

from __future__ import annotations

import dataclasses

import pytest

from looptune.diagnose.rules.chain import (
    CAUSES, CONTENTION_RATIO, STEP_CONTENTION_SHARE, data_cause)
from looptune.diagnose.verdict import analyze
from looptune.measure.records import (
    ChainTotals, Environment, LoaderInfo, Measurements, StepSample)

MS = 1e-3


def _chain(**kw) -> ChainTotals:
    base = dict(batches=100, workers=2, main_batches=0, fetch_s=0.0, fetch_cpu_s=0.0,
                fetch_runq_s=0.0, read_bytes=0.0, rchar=0.0, collate_s=0.0, collate_cpu_s=0.0,
                other_cpu_s=0.0, receive_s=0.0, receives=100, pin_s=0.0, pins=0,
                main_run_s=1.0, main_runq_s=0.0, proc=True)
    return ChainTotals(**{**base, **kw})


def _m(chain: ChainTotals | None, *, wait_ms=8.0, step_ms=10.0, workers=2,
       note=None) -> Measurements:
    steps = [StepSample(step_s=step_ms * MS, data_wait_s=wait_ms * MS) for _ in range(5)]
    loader = LoaderInfo(batch_size=8, num_workers=workers, pin_memory=False, prefetch_factor=2,
                        persistent_workers=False, dataset="Planted")
    return Measurements(steps=steps, warmup_steps=0, loaders=[loader],
                        env=Environment(cpu_count=2, device_type="cpu", device_name="cpu"),
                        input_chain=chain, input_chain_note=note)


# per 100 batches: (chain, the cause it must name)
CASES = [
    (_chain(fetch_s=1.0, fetch_cpu_s=0.05, read_bytes=100 * 2**21, rchar=100 * 2**21), "storage"),
    (_chain(fetch_s=1.0, fetch_cpu_s=0.95), "decode"),
    (_chain(fetch_s=0.1, fetch_cpu_s=0.1, collate_s=0.8, collate_cpu_s=0.8), "collate"),
    (_chain(fetch_s=0.1, fetch_cpu_s=0.1, other_cpu_s=0.5, receive_s=0.6), "transfer"),
    (_chain(fetch_s=0.1, fetch_cpu_s=0.1, pin_s=0.4, pins=100), "transfer"),
    (_chain(fetch_s=1.0, fetch_cpu_s=0.4, fetch_runq_s=0.5), "contention"),  # 0.5 >= 1.0 x 0.4
]


@pytest.mark.parametrize("chain, cause", CASES)
def test_each_cause_is_named_from_its_numbers_with_its_own_remedy(chain, cause):
    v = analyze(_m(chain))
    assert v.bottleneck == "data_loading" and v.data_cause == cause
    ev = v.input_chain
    assert ev["cause"] == cause and set(ev["links_ms"]) == set(CAUSES)
    assert sum(ev["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    if cause != "decode":  # decode's remedies are the pre-decode / batched / workers ones
        (r,) = [r for r in v.remedies if r.kind == f"chain_{cause}"]
        share, link = 0.8, ev["shares"][cause]
        assert r.expected_speedup == pytest.approx(1 / (1 - share * link), abs=0.01)
    others = {r.kind for r in v.remedies if r.kind.startswith("chain_")} - {f"chain_{cause}"}
    # a transfer that costs more than fetch + collate: no workers at all is offered too
    assert others == ({"chain_no_workers"} if cause == "transfer" else set())


def test_storage_says_how_much_came_from_the_device_and_how_much_from_the_cache():
    chain = _chain(fetch_s=1.0, fetch_cpu_s=0.05, read_bytes=100 * 2**20, rchar=100 * 3 * 2**20)
    ev = analyze(_m(chain)).input_chain
    assert ev["read_mib_per_batch"] == 1.0 and ev["cached_mib_per_batch"] == 2.0
    assert "storage delivered 1.0 MiB per batch of 3.0 MiB read" in ev["reason"]


def test_contention_wins_from_its_ratio_not_its_size():
    # waiting 0.39 s vs running 0.4 s: just under CONTENTION_RATIO, the CPU work is the cause
    assert CONTENTION_RATIO == 1.0
    below = _chain(fetch_s=1.0, fetch_cpu_s=0.4, fetch_runq_s=0.39)
    assert analyze(_m(below)).data_cause == "decode"
    at = dataclasses.replace(below, fetch_runq_s=0.4)
    assert analyze(_m(at)).data_cause == "contention"


def test_no_cause_when_the_step_does_not_wait_for_data_or_the_chain_was_not_seen():
    chain = _chain(fetch_s=1.0, fetch_cpu_s=0.95)
    assert analyze(_m(chain, wait_ms=1.0)).data_cause is None  # compute-bound: no data cause
    assert analyze(_m(chain, wait_ms=1.0)).input_chain["cause"] == "decode"  # still reported
    v = analyze(_m(None, note="the DataLoader's 2 worker(s) were not seen"))
    assert v.data_cause is None and v.input_chain == {"note": "the DataLoader's 2 worker(s) were not seen"}
    assert data_cause(_m(_chain(batches=0))) is None


def test_the_step_waiting_for_a_cpu_beside_workers_is_a_finding_even_without_a_data_wait():
    share = STEP_CONTENTION_SHARE
    hot = _chain(fetch_s=0.1, fetch_cpu_s=0.1, main_run_s=1.0, main_runq_s=share)
    v = analyze(_m(hot, wait_ms=0.4))
    (f,) = [f for f in v.findings if f.name == "step_contention"]
    assert "beside 2 DataLoader worker(s) on 2 core(s)" in f.message
    cool = dataclasses.replace(hot, main_runq_s=share * 0.9)
    assert not [f for f in analyze(_m(cool, wait_ms=0.4)).findings if f.name == "step_contention"]
    alone = dataclasses.replace(hot, workers=0)  # no workers: the step's own threads, not ours
    assert not [f for f in analyze(_m(alone, wait_ms=0.4)).findings if f.name == "step_contention"]


def test_contention_and_no_workers_are_dataloader_calls_that_verify_reruns():
    from looptune.diagnose.verify import _how

    busy = _chain(fetch_s=1.0, fetch_cpu_s=0.4, fetch_runq_s=0.5)
    (r,) = [r for r in analyze(_m(busy, workers=5)).remedies if r.kind == "chain_contention"]
    assert r.action == "DataLoader(num_workers=1)"  # 2 cores: one left to the step
    assert _how(r, 8) == {"loader_overrides": {"num_workers": 1}}
    # moving the batch (0.11 s / 100) costs more than fetching + collating it (0.01 + 0.02)
    moved = _chain(fetch_s=0.01, fetch_cpu_s=0.01, collate_s=0.02, collate_cpu_s=0.02,
                   other_cpu_s=0.05, receive_s=0.06)
    (r,) = [r for r in analyze(_m(moved)).remedies if r.kind == "chain_no_workers"]
    assert _how(r, 8) == {"loader_overrides": {"num_workers": 0}}
    assert r.expected_speedup == pytest.approx(1 / (1 - 0.8 * (0.11 - 0.03) / 0.14), abs=0.01)
    cheap = dataclasses.replace(moved, other_cpu_s=0.0, receive_s=0.025)  # moving is cheaper
    assert not [r for r in analyze(_m(cheap)).remedies if r.kind == "chain_no_workers"]


def test_the_ceiling_is_the_step_without_its_data_wait():
    ev = analyze(_m(_chain(fetch_s=1.0, fetch_cpu_s=0.95), wait_ms=8.0, step_ms=10.0)).input_chain
    assert ev["ceiling"] == 5.0 and "would run 5.00x faster: 10.000 ms -> 2.000 ms" in ev["ceiling_reason"]


def test_an_action_two_rules_reach_is_listed_once_with_the_larger_bound():
    from looptune.measure.records import WorkerRead

    moved = _chain(fetch_s=0.01, fetch_cpu_s=0.01, collate_s=0.02, collate_cpu_s=0.02,
                   other_cpu_s=0.05, receive_s=0.06)
    m = dataclasses.replace(_m(moved), worker_read=WorkerRead(
        batch_s=0.004, receive_s=0.001, batches=10, main_s=0.0005))
    actions = [r.action for r in analyze(m).remedies]
    assert len(actions) == len(set(actions))
