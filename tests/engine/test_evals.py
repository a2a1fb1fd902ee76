"""engine/evals.py: evaluation points kept during training and scored after it."""

import pytest
import torch

import looptune
from looptune.engine import evals
from looptune.engine.checkpoint import load_checkpoint
from looptune.engine.evals import DeferredEvals

from .test_loop_features import CE, DEVICE, mlp, separable


def test_points_are_scored_in_order_on_a_copy_of_their_weights():
    model = mlp()
    kept = DeferredEvals(model)
    assert kept.enabled
    first = {k: v.clone() for k, v in model.state_dict().items()}
    kept.keep(model, {"batches": 8})
    with torch.no_grad():
        model[0].weight.add_(1.0)  # training moves on
    kept.keep(model, {"batches": 16})
    seen = []

    def evaluate(m):
        seen.append(m)
        return float(m[0].weight.sum())

    scored = kept.score(model, evaluate)
    assert [e["batches"] for e, _, _ in scored] == [8, 16] and not kept.pending
    assert scored[0][1] == pytest.approx(float(first["0.weight"].sum()))
    assert scored[1][1] == pytest.approx(float(model[0].weight.sum()))
    assert all(m is not model for m in seen)  # the trained module itself is left alone
    assert kept.score(model, evaluate) == []


def test_a_model_over_the_limit_is_evaluated_in_place(monkeypatch):
    monkeypatch.setattr(evals, "MAX_BYTES", 100)
    assert not DeferredEvals(mlp()).enabled


def _run(monkeypatch, max_bytes, tmp_path=None):
    monkeypatch.setattr(evals, "MAX_BYTES", max_bytes)
    return looptune.train(mlp(), separable(), recipe=DEVICE, loss_fn=CE,
                          eval_data=separable(256, 1), device="cpu", epochs=3,
                          target_accuracy=0.8, eval_every=5,
                          checkpoint_dir=tmp_path, checkpoint_every=7 if tmp_path else None)


def test_deferred_and_in_place_evaluation_give_the_same_points_and_metrics(monkeypatch, tmp_path):
    inline = _run(monkeypatch, 0)
    deferred = _run(monkeypatch, 4 * 2**20)
    with_ckpt = _run(monkeypatch, 4 * 2**20, tmp_path)  # each checkpoint scores what is pending
    for res in (deferred, with_ckpt):
        assert [(e["batches"], e["accuracy"]) for e in res.evals] == [
            (e["batches"], e["accuracy"]) for e in inline.evals]
        assert res.epoch_loss == inline.epoch_loss
        first_hit = next(e for e in res.evals if e["accuracy"] >= 0.8)
        assert res.time_to_target_s == pytest.approx(first_hit["train_s"])
        assert res.test_accuracy == inline.test_accuracy
    saved = load_checkpoint(sorted(tmp_path.glob("ckpt-*.pt"))[-1])
    assert _evals_in(saved), "a checkpoint holds the points scored before it"


def _evals_in(state: dict) -> list:
    for value in state.values():
        if isinstance(value, dict) and value.get("evals"):
            return value["evals"]
    return state.get("evals") or []
