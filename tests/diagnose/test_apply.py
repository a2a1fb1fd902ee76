"""Remedies applied from outside an unmodified script (diagnose.apply) and how --verify maps a
remedy onto them (diagnose.verify._how)."""

from __future__ import annotations

import threading
import types

import pytest
import torch

from looptune.diagnose.apply import (FRAMEWORK_SWITCH, as_float32, framework_precision, overridden_optimizer,
                                     per_forward_autocast, scaled_lr)
from looptune.diagnose.rules.batch import lr_rule
from looptune.diagnose.rules.compute import bf16_action
from looptune.measure.records import Measurements
from looptune.diagnose.rules.records import Remedy
from looptune.diagnose.verify import _how
from looptune.measure.probe_hooks import framework_of_stack


class _Outer(torch.nn.Module):
    def __init__(self, seen):
        super().__init__()
        self.inner, self.seen = torch.nn.Linear(4, 4), seen

    def forward(self, x):
        self.seen.append(torch.is_autocast_enabled("cpu"))
        return self.inner(x)


def test_autocast_is_entered_per_outermost_forward_and_left_after_it():
    seen, hits = [], [0]
    model = _Outer(seen)
    with per_forward_autocast("cpu", hits=hits):
        for _ in range(3):
            out = model(torch.randn(2, 4))
            # the inner Linear ran under autocast (its bf16 output cast back at the forward's end)
            assert out.grad_fn.name() == "ToCopyBackward0" and out.dtype == torch.float32
            assert not torch.is_autocast_enabled("cpu")  # left at the forward's end
    assert hits == [3] and seen == [True] * 3  # the inner module did not count again
    assert model(torch.randn(2, 4)).dtype == torch.float32  # hooks removed


def test_outputs_come_back_as_float32_for_a_loss_computed_outside_autocast():
    # the pytorch/examples VAE: F.binary_cross_entropy(recon, x) after the forward refused a bf16
    # recon against a float32 x ("Found dtype Float but expected BFloat16"): the rerun failed
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sigmoid())
    x = torch.rand(2, 4)
    with per_forward_autocast("cpu"):
        recon = model(x)
        torch.nn.functional.binary_cross_entropy(recon, x).backward()
    assert recon.dtype == torch.float32 and model[0].weight.grad is not None
    nested = as_float32({"a": (torch.ones(1, dtype=torch.bfloat16), [torch.ones(1, dtype=torch.float16)]),
                         "n": torch.ones(1, dtype=torch.long)})
    assert nested["a"][0].dtype == nested["a"][1][0].dtype == torch.float32
    assert nested["n"].dtype == torch.long


def test_the_weights_of_every_step_are_used_not_the_first_steps_casts():
    # a context held open across steps caches its bf16 casts of the weights: the second forward
    # would use the first step's weights. Per forward, it sees the update.
    lin = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8)
    with per_forward_autocast("cpu"):
        first = lin(x)
        with torch.no_grad():
            lin.weight.mul_(2)
        assert torch.allclose(lin(x).float(), 2 * first.float(), rtol=2e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what the held context does
        first = lin(x)
        with torch.no_grad():
            lin.weight.mul_(2)
        stale = lin(x)
    assert torch.equal(stale, first)


def test_another_thread_is_left_alone():
    seen = []
    model = _Outer(seen)
    with per_forward_autocast("cpu"):
        t = threading.Thread(target=lambda: model(torch.randn(2, 4)))
        t.start()
        t.join()
    assert seen == [False]


def test_the_optimizer_gets_the_remedys_arguments_and_is_restored():
    hits = [0]
    p = [torch.nn.Parameter(torch.ones(2))]
    original = torch.optim.AdamW.__init__
    with overridden_optimizer("AdamW", {"foreach": None, "fused": True}, hits=hits):
        opt = torch.optim.AdamW(p, lr=1e-3, foreach=False)  # the script's own choice is replaced
        adam = torch.optim.Adam(p)  # another class: untouched
    assert hits == [1] and opt.param_groups[0]["fused"] is True
    assert opt.param_groups[0]["foreach"] is None and not adam.param_groups[0]["fused"]
    assert torch.optim.AdamW.__init__ is original


def test_a_larger_batchs_learning_rate_is_scaled_once_in_every_group_and_restored():
    hits = [0]
    w, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))
    original = torch.optim.Adam.__dict__["__init__"]
    with scaled_lr("Adam", 2.0, hits=hits):
        opt = torch.optim.Adam([{"params": [w]}, {"params": [b], "lr": 0.5}], lr=1e-3)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # starts from the scaled rate
        sgd = torch.optim.SGD([w], lr=0.1)  # another class: untouched
    assert hits == [1]
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(2e-3), pytest.approx(1.0)]
    assert sched.base_lrs == [pytest.approx(2e-3), pytest.approx(1.0)]
    assert opt.defaults["lr"] == pytest.approx(2e-3) and sgd.param_groups[0]["lr"] == 0.1
    assert torch.optim.Adam.__dict__["__init__"] is original
    assert torch.optim.Adam([w], lr=1e-3).param_groups[0]["lr"] == 1e-3

    class Mine(torch.optim.SGD):  # a subclass calling its parent's constructor: scaled once
        def __init__(self, params):
            super().__init__(params, lr=0.1, momentum=0.9)

    with scaled_lr("SGD", 4.0):
        assert Mine([w]).param_groups[0]["lr"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="must be > 0"):
        with scaled_lr("SGD", 0.0):
            pass


@pytest.mark.parametrize("name, k, expected", [
    ("SGD", 4, (4.0, "linear scaling for SGD")),
    ("Adam", 4, (2.0, "square-root scaling for Adam")),
    ("AdamW", 2, (1.4142, "square-root scaling for AdamW")),
    ("LBFGS", 4, None), (None, 4, None)])
def test_the_learning_rate_rule_follows_the_optimizers_class(name, k, expected):
    assert lr_rule(name, k) == expected


def test_a_batch_remedy_reruns_with_its_learning_rate():
    remedy = Remedy(action="batch_size 32 -> 128 (fewer, larger steps; learning rate x2: "
                    "square-root scaling for Adam)", expected_speedup=1.8, reason="r",
                    kind="batch", lr_scale=("Adam", 2.0))
    assert _how(remedy, 32) == {"loader_overrides": {"batch_size": 128},
                                "lr_scale": ("Adam", 2.0)}
    assert _how(remedy, 64) is None  # not this loader's batch size


def test_the_frameworks_own_switch_is_set_on_its_entry_class(tmp_path):
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    hits = [0]
    with framework_precision("transformers", hits=hits):
        args = TrainingArguments(output_dir=str(tmp_path), fp16=False, use_cpu=True)
    assert hits == [1] and args.bf16 is True
    assert TrainingArguments(output_dir=str(tmp_path), use_cpu=True).bf16 is False


def _frame(name, back=None):
    return types.SimpleNamespace(f_globals={"__name__": name}, f_back=back)


def test_the_framework_is_the_outermost_training_package_on_the_stack():
    inner = _frame("torch.optim.optimizer", _frame("accelerate.optimizer",
                                                   _frame("transformers.trainer", _frame("__main__"))))
    assert framework_of_stack(inner) == "transformers"  # the Trainer runs Accelerate inside
    assert framework_of_stack(_frame("accelerate.optimizer", _frame("__main__"))) == "accelerate"
    assert framework_of_stack(_frame("lightning_fabric.wrappers")) == "lightning.fabric"
    assert framework_of_stack(_frame("transformers_helper", _frame("__main__"))) is None
    assert framework_of_stack(_frame("__main__")) is None


def _measured(framework=None):
    return Measurements(steps=[], warmup_steps=0, framework=framework)


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_SWITCH))
def test_bf16_through_a_framework_is_its_switch_and_reruns_through_it(framework):
    action, why = bf16_action(_measured(framework))
    assert FRAMEWORK_SWITCH[framework][3] in action and framework in why
    remedy = Remedy(action=action, expected_speedup=1.5, reason="r", kind="precision")
    assert _how(remedy, 32) == {"framework": framework}


def test_bf16_in_a_plain_loop_is_autocast_per_forward():
    action, why = bf16_action(_measured())
    assert action.startswith("bf16 autocast around each forward") and why == ""
    remedy = Remedy(action=action, expected_speedup=1.5, reason="r", kind="precision")
    assert _how(remedy, 32) == {"autocast": "bf16"}


@pytest.mark.parametrize("action, expected", [
    ("torch.optim.AdamW(..., fused=True)", ("AdamW", {"foreach": None, "fused": True})),
    ("torch.optim.SGD(..., foreach=True)", ("SGD", {"foreach": True, "fused": None})),
])
def test_an_optimizer_remedy_reruns_through_its_constructor(action, expected):
    remedy = Remedy(action=action, expected_speedup=1.3, reason="r", kind="optimizer")
    assert _how(remedy, 32) == {"optimizer": expected}
    zero = Remedy(action="optimizer.zero_grad(set_to_none=True)", expected_speedup=1.1,
                  reason="r", kind="zero_grad")
    assert _how(zero, 32) is None  # inside the script's own loop: not from outside


def test_accelerates_bf16_switch_works_after_the_scripts_own_accelerator():
    # issue 32 (verdict_check on a Zen 5 VM): the bf16 rerun of an Accelerate loop raised
    # "AcceleratorState has already been initialized and cannot be changed" before its first step
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    Accelerator(cpu=True)  # the script's own run, without mixed precision
    hits = [0]
    with framework_precision("accelerate", hits=hits):
        assert Accelerator(cpu=True).mixed_precision == "bf16" and hits == [1]
    assert Accelerator(cpu=True).mixed_precision == "no"  # the next run: the script's own again


def test_batched_augmentation_is_not_rerun_and_the_reason_says_why():
    # issue 33: "reading its 12000 samples once would take ~6 s (more than 20 s for a rerun)"
    from looptune.diagnose.verify import _why_not

    aug = Remedy(action="augment whole batches on the device: ...", expected_speedup=3.5,
                 reason="r", kind="tensorized")
    assert _how(aug, 64, decode_s=6.0) is None
    why = _why_not(aug, 64, 6.0, 12000)
    assert "random" in why and "change to the script's code" in why and "20 s" not in why
