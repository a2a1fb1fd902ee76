"""Adam and AdamW whose ``step()`` calls the fused kernel directly (``impl="direct"``).

``torch.optim.Adam(fused=True).step()`` runs one fused kernel, but around it every step pays
Python bookkeeping: a profiler span, the step-hook loops, ``_init_group`` walking every
parameter and its state, grouping the tensors by device and dtype, a ``_foreach_add_`` on one
step counter per parameter, and ``zero_grad``'s own span and loop. On a small model that costs
more than the update itself (batch-64 MNIST MLP on a 2-core CPU: ~125 us per step around a
~45 us kernel). Here that work is done once: after torch's own first step has created the state,
the lists the kernel takes are kept, the parameters of a group share one step counter (they
step together), and each step is: read the gradients, add 1 to the counter, call
``torch._fused_adam_`` / ``torch._fused_adamw_`` with the group's current hyper-parameters (so
LR schedules still work). The update is the same kernel on the same tensors: bit for bit
torch's (tested).

Whenever the fast path's assumptions do not hold it steps through torch's own ``step()``
instead: a closure, registered step hooks (global or the optimizer's), a GradScaler's
``grad_scale``/``found_inf``, amsgrad, a parameter without a gradient, a tensor lr, or a
changed set of parameters. ``state_dict()`` gives every parameter its own step tensor, so a
checkpoint loads into a plain torch Adam; ``load_state_dict()`` rebuilds the plan.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.optim.optimizer as torch_optimizer

__all__ = ["DirectAdam", "DirectAdamW", "is_direct"]


class _Plan:
    """What the kernel needs for one param group, built once."""

    def __init__(self, group: dict[str, Any], state: dict[Any, Any]) -> None:
        self.params = list(group["params"])
        self.data = [p.detach() for p in self.params]  # in-place updates outside autograd
        self.exp_avgs = [state[p]["exp_avg"] for p in self.params]
        self.exp_avg_sqs = [state[p]["exp_avg_sq"] for p in self.params]
        shared = state[self.params[0]]["step"]
        for p in self.params:  # the group steps together: one counter, one add per step
            state[p]["step"] = shared
        self.step = shared
        self.steps = [shared] * len(self.params)


def _plannable(opt: torch.optim.Optimizer) -> bool | str:
    """True; False: not yet (no state before torch's first step); "never": these settings or
    diverged step counters (until the state is loaded again or a group is added)."""
    for group in opt.param_groups:
        if group["amsgrad"] or group["maximize"] or isinstance(group["lr"], torch.Tensor):
            return "never"
        params = group["params"]
        if not params or any(p not in opt.state or "exp_avg" not in opt.state[p] for p in params):
            return False
        devices = {(p.device, p.dtype) for p in params}
        if len(devices) != 1 or any(p.is_sparse or p.is_complex() for p in params):
            return "never"
        steps = {float(opt.state[p]["step"]) for p in params}  # sync: once, when planning
        if len(steps) != 1:  # params that skipped steps (no grad) keep their own counters
            return "never"
    return True


class _Direct:
    """The direct step, mixed into Adam / AdamW (which must come after it in the MRO)."""

    _plans: list[_Plan] | None = None
    _torch_only = False  # set once planning can never succeed (amsgrad, diverged counters)

    def step(self, closure=None):  # noqa: D401 - torch's signature
        if closure is not None or self._hooked() or self._scaled() or self._torch_only:
            return self._torch_step(closure)
        if self._plans is None:
            ready = _plannable(self)
            if ready is not True:
                self._torch_only = ready == "never"  # no per-step re-check (it reads counters)
                return self._torch_step(closure)
            self._plans = [_Plan(g, self.state) for g in self.param_groups]
        grads = []  # every group checked before any is updated: a fallback steps them all
        for group, plan in zip(self.param_groups, self._plans):
            params = group["params"]
            if len(params) != len(plan.params) or any(
                    p is not q for p, q in zip(params, plan.params)):  # params replaced: replan
                return self._torch_step(closure)
            found = [p.grad for p in plan.params]
            if any(g is None for g in found):
                return self._torch_step(closure)
            grads.append(found)
        for group, plan, found in zip(self.param_groups, self._plans, grads):
            beta1, beta2 = group["betas"]
            kernel = (torch._fused_adamw_ if group.get("decoupled_weight_decay")
                      else torch._fused_adam_)
            plan.step.add_(1)
            kernel(plan.data, found, plan.exp_avgs, plan.exp_avg_sqs, [], plan.steps,
                   amsgrad=False, lr=group["lr"], beta1=float(beta1), beta2=float(beta2),
                   weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                   grad_scale=None, found_inf=None)
        return None  # an LR scheduler's own wrapper of opt.step records the call

    step.hooked = True  # tells torch's Optimizer.__init__ not to wrap it in profile_hook_step

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            return super().zero_grad(set_to_none=False)
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        return None

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        # each parameter its own counter, so it loads into a torch Adam. New dicts: torch's
        # state_dict() hands out the live per-parameter state dicts themselves, and replacing
        # their shared counter would freeze what the next checkpoint saves
        out["state"] = {k: ({**v, "step": v["step"].clone()}
                            if isinstance(v.get("step"), torch.Tensor) else v)
                        for k, v in out["state"].items()}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._plans, self._torch_only = None, False
        super().load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._unplan()
        self._torch_only = False
        super().add_param_group(param_group)

    def _torch_step(self, closure):
        self._unplan()
        step = self._torch_class().step  # torch wraps it in profile_hook_step (hooks, span)
        if not getattr(step, "hooked", False):  # no instance of that class was built yet
            step = torch_optimizer.Optimizer.profile_hook_step(step)
        return step(self, closure)

    def _unplan(self) -> None:
        """Give every parameter its own step counter again (torch's step adds 1 to each)."""
        if self._plans is None:
            return
        for plan in self._plans:
            for p in plan.params:
                self.state[p]["step"] = plan.step.clone()
        self._plans = None

    def _hooked(self) -> bool:
        return bool(self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks
                    or torch_optimizer._global_optimizer_pre_hooks
                    or torch_optimizer._global_optimizer_post_hooks)

    def _scaled(self) -> bool:
        return (getattr(self, "grad_scale", None) is not None
                or getattr(self, "found_inf", None) is not None)

    def _torch_class(self) -> type[torch.optim.Optimizer]:
        return next(c for c in type(self).__mro__ if c.__module__.startswith("torch.optim"))


class DirectAdam(_Direct, torch.optim.Adam):
    """``torch.optim.Adam(fused=True)`` with the direct step (module docstring)."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, fused=True, **kwargs)


class DirectAdamW(_Direct, torch.optim.AdamW):
    """``torch.optim.AdamW(fused=True)`` with the direct step (module docstring)."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, fused=True, **kwargs)


def is_direct(opt: torch.optim.Optimizer) -> bool:
    return isinstance(opt, _Direct)
