"""Measured DataLoader settings: workers, prefetch depth, persistent workers, pinned memory and
batched reads, each chosen from measurements on the user's data and machine, with its reason."""

from __future__ import annotations

import copy
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from looptune.data.faults import WORKER_GONE, guarded, traced, worker_failure
from looptune.engine.device import device_problem, resolve_device
from looptune.errors import ConfigError
from looptune.measure.parity import mean_loss_parity
from looptune.recipe import Decision

__all__ = ["LoaderTuneResult", "tune_loader", "dataloader_line"]

WORKER_TIMEOUT_S = 60  # a trial whose worker produces nothing for this long is recorded as hung


@dataclass(frozen=True, kw_only=True)
class LoaderTuneResult:
    recommended: dict[str, Any]  # DataLoader keyword arguments to use
    decisions: list[Decision]
    trials: list[dict[str, Any]]  # settings, samples_per_s (median), status, reason
    line: str  # ready to paste: DataLoader(dataset, batch_size=..., ...)
    elapsed_s: float  # time the search took
    end_to_end: bool  # throughput measured with a training step (model given)
    batch_size: int | None = None  # samples per batch in every trial
    # the training process's intra-op threads beside the workers (torch.set_num_threads), when
    # fewer than its own measured faster; None: leave them
    threads: int | None = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"kind": "tune-loader", "batch_size": self.batch_size,
                "recommended": self.recommended, "threads": self.threads, "line": self.line,
                "elapsed_s": self.elapsed_s,
                "end_to_end": self.end_to_end, "trials": self.trials,
                "decisions": [asdict(d) for d in self.decisions]}


@dataclass(kw_only=True)
class _Search:
    dataset: Dataset
    batch_size: int
    device: torch.device
    model: torch.nn.Module | None
    loss_fn: Any
    batches: int
    warmup: int
    repeats: int
    threshold: float
    deadline: float
    trials: list[dict[str, Any]] = field(default_factory=list)
    # per batch: the loss of the fixed (lr 0) model in the first trial with a training step
    base_losses: list[float] | None = None

    def measure(self, **settings: Any) -> dict[str, Any]:
        """samples/s of these settings (median of repeats), recorded as a trial; with a model,
        also the mean loss of its batches, which must match the first trial's (loss parity)."""
        trial = {**settings, "samples_per_s": None, "status": "ok", "reason": ""}
        losses: list[float] = []
        try:
            rates = []
            for _ in range(self.repeats):
                rate, got = self._rate(settings)
                rates.append(rate)
                losses += got
            trial["samples_per_s"] = statistics.median(rates)
        except Exception as err:  # a worker crashed or hung (timeout): record it, go on
            trial.update(status="failed", reason=_short_error(err))
        if losses and trial["status"] == "ok":
            self._check_parity(trial, losses)
        self.trials.append(trial)
        return trial

    def _check_parity(self, trial: dict[str, Any], losses: list[float]) -> None:
        """The same model at lr 0 on these settings' batches: a setting that delivers other data
        (a broken collate, lost or repeated samples) changes the training, not just its speed."""
        trial["loss"] = statistics.fmean(losses)
        if self.base_losses is None:
            self.base_losses = losses
            return
        check = mean_loss_parity(self.base_losses, losses)
        trial["loss_parity"] = check["parity"]
        if check["parity"] is False:
            trial.update(status="failed", reason=f"changes the training: {check['reason']}")

    def over_budget(self) -> bool:
        return time.perf_counter() >= self.deadline

    def _rate(self, settings: dict[str, Any]) -> tuple[float, list[float]]:
        threads = settings.get("intra_op_threads")
        if threads is None:
            return self._timed(settings)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)  # the step's threads beside the workers, for this trial
        try:
            return self._timed(settings)
        finally:
            torch.set_num_threads(before)

    def _timed(self, settings: dict[str, Any]) -> tuple[float, list[float]]:
        loader = _loader(self.dataset, self.batch_size, settings)
        step = _trainer(self.model, self.loss_fn, self.device) if self.model is not None else None
        batches = iter(loader)
        it, n = guarded(loader, batches), 0  # a dataset exception: the sample and worker named
        try:
            for _ in range(self.warmup):  # worker start-up and first batches: not steady state
                self._consume(next(it), step)
            t0 = time.perf_counter()
            for batch in it:
                self._consume(batch, step)
                n += 1
                if n >= self.batches:
                    break
        except WORKER_GONE as err:  # a worker died or hung: name the sample it was reading
            try:  # first statement: torch's SIGCHLD handler, pending when the pipe broke, runs
                named = worker_failure(err, loader, batches)  # at the next call and raises
            except WORKER_GONE as late:
                named, err = worker_failure(late, loader, batches), late
            if named is None:
                raise err
            raise named from err
        if step is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # sync: the last steps must finish
        elapsed = time.perf_counter() - t0
        del it, batches  # shuts non-persistent workers down
        # read after the clock: one copy of every batch's loss, no sync per step
        losses = ([] if step is None or not step.losses else
                  torch.stack(step.losses).float().cpu().tolist())
        return n * self.batch_size / elapsed, losses

    def _consume(self, batch: Any, step) -> None:
        if step is not None:
            step(batch)


def _short_error(err: Exception) -> str:
    """The exception's first line and, for a worker's re-raised traceback, its original error."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    head = f"{type(err).__name__}: {lines[0] if lines else ''}"
    return head if len(lines) < 2 else f"{head} ... {lines[-1].strip()}"[:400]


def _loader(dataset: Dataset, batch_size: int, settings: dict[str, Any]) -> DataLoader:
    kwargs = {k: v for k, v in settings.items() if k not in ("batched", "intra_op_threads")}
    if kwargs.get("num_workers", 0) > 0:
        kwargs.setdefault("timeout", WORKER_TIMEOUT_S)
    data = dataset if settings.get("batched", True) else _PerSample(dataset)
    return DataLoader(traced(data, kwargs.get("num_workers", 0)), batch_size=batch_size,
                      shuffle=True, **kwargs)


class _PerSample(Dataset):
    """The dataset without ``__getitems__``: forces one ``__getitem__`` call per sample."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]


def _trainer(model: torch.nn.Module, loss_fn, device: torch.device):
    """A training step on a private copy of the model (the caller's model is never touched)."""
    twin = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(twin.parameters(), lr=0.0)  # lr 0: the work of a step, no drift

    def step(batch: Any) -> None:
        x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(twin(x), y)
        loss.backward()
        opt.step()
        step.losses.append(loss.detach())  # kept on the device: read once, after the timing

    step.losses = []  # type: ignore[attr-defined]
    return step


def tune_loader(dataset: Dataset, *, batch_size: int = 64, model: torch.nn.Module | None = None,
                loss_fn=torch.nn.functional.cross_entropy, device: str = "auto",
                budget_s: float = 60.0, threshold: float = 0.03, max_workers: int | None = None,
                batches: int = 30, warmup: int = 3, repeats: int = 3) -> LoaderTuneResult:
    """Measure DataLoader settings on ``dataset`` and recommend the fastest, with reasons.

    Workers grow from 0 while each step up gains at least ``threshold``; then prefetch depth,
    persistent workers, pinned memory (GPU only) and batched reads (datasets with
    ``__getitems__``) are measured at the chosen worker count. With ``model``, every trial runs a
    training step on a copy of it: on a machine with few cores the workers compete with the step.

    Args:
        dataset: a map-style Dataset of (input, target) samples.
        batch_size: samples per batch in every trial.
        model, loss_fn: measure end to end with a training step (recommended).
        device: where the training step runs ("auto", "cpu", "cuda").
        budget_s: stop starting new trials after this many seconds.
        threshold: the smallest relative gain that justifies a setting (3% = 0.03).
        max_workers: the largest worker count tried (default: the CPU count, at most 8).
        batches, warmup, repeats: batches timed per trial after ``warmup``; median of ``repeats``.

    Returns:
        The recommended keyword arguments, the decisions with their evidence, every trial.

    Raises:
        ConfigError: every invalid argument at once, before anything is measured.

    Example:
        >>> res = looptune.tune_loader(ds, batch_size=64, model=net)  # doctest: +SKIP
        >>> print(res.line)
    """
    cores = os.cpu_count() or 1
    bound = min(cores, 8) if max_workers is None else max_workers
    _check(dataset, batch_size, device, budget_s, threshold, bound, batches, warmup, repeats, model)
    t0 = time.perf_counter()
    dev = resolve_device(device)
    search = _Search(dataset=dataset, batch_size=batch_size, device=dev, model=model, loss_fn=loss_fn, batches=batches, warmup=warmup, repeats=repeats,
                     threshold=threshold, deadline=t0 + budget_s)
    decisions, settings = _search_workers(search, bound, cores)
    for choose in (_choose_prefetch, _choose_persistent, _choose_pin, _choose_batched):
        decision = choose(search, settings)
        if decision is not None:
            decisions.append(decision)
            settings[decision.name] = decision.value
    recommended = {k: v for k, v in settings.items()
                   if k not in ("batched", "intra_op_threads") or (k == "batched" and v is False)}
    threads = settings.get("intra_op_threads")
    line = dataloader_line(batch_size, recommended) + (
        f"  # and torch.set_num_threads({threads}) in the training process" if threads else "")
    return LoaderTuneResult(recommended=recommended, decisions=decisions, trials=search.trials,
                            line=line, threads=threads,
                            elapsed_s=time.perf_counter() - t0, end_to_end=model is not None,
                            batch_size=batch_size)


def dataloader_line(batch_size: int, kwargs: dict[str, Any]) -> str:
    shown = {k: v for k, v in kwargs.items() if k != "batched"}
    args = "".join(f", {k}={v!r}" for k, v in shown.items())
    note = "  # wrap the dataset to drop __getitems__" if kwargs.get("batched") is False else ""
    return f"DataLoader(dataset, batch_size={batch_size}, shuffle=True{args}){note}"


def _check(dataset, batch_size, device, budget_s, threshold, bound, batches, warmup, repeats, model):
    problems = []
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        problems.append(f"dataset is a {type(dataset).__name__}: pass a map-style Dataset.")
    for name, value, low in (("batch_size", batch_size, 1), ("batches", batches, 1),
                             ("warmup", warmup, 0), ("repeats", repeats, 1), ("max_workers", bound, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{name}={value!r} is invalid: must be an integer >= {low}.")
    if not (isinstance(budget_s, (int, float)) and budget_s > 0):
        problems.append(f"budget_s={budget_s!r} is invalid: seconds > 0, e.g. --budget-s 60.")
    if not (isinstance(threshold, (int, float)) and 0 <= threshold < 1):
        problems.append(f"threshold={threshold!r} is invalid: a fraction in [0, 1), e.g. 0.03.")
    if model is not None and not isinstance(model, torch.nn.Module):
        problems.append(f"model is a {type(model).__name__}: pass a torch.nn.Module or None.")
    problems += [p for p in [device_problem(device)] if p]
    if problems:
        raise ConfigError(problems)


def _gain(new: dict, old: dict) -> float:
    if new["samples_per_s"] is None or old["samples_per_s"] is None:
        return -1.0
    return new["samples_per_s"] / old["samples_per_s"] - 1


def _search_workers(search: _Search, bound: int, cores: int) -> tuple[list[Decision], dict]:
    best = search.measure(num_workers=0)
    if best["status"] != "ok":
        if search.model is None:
            raise ConfigError(f"the dataset cannot be loaded even in the main process: "
                              f"{best['reason']}")
        loss = getattr(search.loss_fn, "__name__", type(search.loss_fn).__name__)
        raise ConfigError(  # the step, not the loading, may be what failed: say both
            f"loading a batch in the main process and training a step with loss_fn={loss} "
            f"failed: {best['reason']}. Check that loss_fn fits the model's outputs (a language "
            "model's N x T x V logits need its own loss), or measure loading only (no model).")
    tried, k = [best], 1
    while k <= bound and not search.over_budget():
        trial = search.measure(num_workers=k)
        fewer = _balanced_threads(search, k, cores)
        if fewer is not None and trial["status"] == "ok" and not search.over_budget():
            # the step's intra-op threads and k busy workers share the cores: also measured with
            # the step on the cores the workers leave (no oversubscription); the faster is kept
            alt = search.measure(num_workers=k, intra_op_threads=fewer)
            tried += [trial, alt]
            if alt["status"] == "ok" and _gain(alt, trial) > 0:
                trial = alt
        else:
            tried.append(trial)
        gain = _gain(trial, best)
        if trial["status"] != "ok" or gain < search.threshold:
            break  # adaptive: more workers stopped paying (or failed: a crash, other data)
        best, k = trial, k * 2 if k >= 2 else k + 1
    evidence = [{"num_workers": t["num_workers"], "samples_per_s": t["samples_per_s"],
                 "status": t["status"],
                 **({"intra_op_threads": t["intra_op_threads"]} if "intra_op_threads" in t else {})}
                for t in tried]
    decisions = [Decision("num_workers", best["num_workers"],
                          reason=_workers_reason(best, tried, search, cores), evidence=evidence)]
    settings = {"num_workers": best["num_workers"]}
    if "intra_op_threads" in best:
        other = next(t for t in tried if t["num_workers"] == best["num_workers"]
                     and "intra_op_threads" not in t)
        decisions.append(Decision(
            "intra_op_threads", best["intra_op_threads"], reason=(
                f"torch.set_num_threads({best['intra_op_threads']}) in the training process: "
                f"{best['samples_per_s']:,.0f} samples/s with {best['num_workers']} worker(s) vs "
                f"{other['samples_per_s']:,.0f} with its {torch.get_num_threads()} threads "
                f"({cores} CPU cores: the step and the workers no longer take turns)"),
            evidence=[{"intra_op_threads": best["intra_op_threads"],
                       "samples_per_s": best["samples_per_s"]},
                      {"intra_op_threads": torch.get_num_threads(),
                       "samples_per_s": other["samples_per_s"]}]))
        settings["intra_op_threads"] = best["intra_op_threads"]
    return decisions, settings


def _balanced_threads(search: _Search, workers: int, cores: int) -> int | None:
    """The step's thread count that leaves a core to each of ``workers`` workers, when a CPU
    training step is measured and it is fewer than the threads it has now; else None."""
    if search.model is None or search.device.type != "cpu":
        return None
    fewer = cores - workers
    return fewer if 1 <= fewer < torch.get_num_threads() else None


def _workers_reason(best: dict, tried: list[dict], search: _Search, cores: int) -> str:
    rate = f"{best['samples_per_s']:,.0f} samples/s"
    nxt = next((t for t in tried if t["num_workers"] > best["num_workers"]), None)
    mode = "with a training step" if search.model is not None else "loading only"
    if nxt is None:
        return f"{best['num_workers']} workers: {rate} ({mode}); the budget or the bound ended the search"
    if nxt["status"] != "ok":
        return f"{best['num_workers']} workers: {rate}; {nxt['num_workers']} failed ({nxt['reason']})"
    change = _gain(nxt, best)
    why = (f" ({cores} CPU cores: workers compete with the step)"
           if change < 0 and search.model is not None else "")
    return (f"{best['num_workers']} workers: {rate} ({mode}); {nxt['num_workers']} gave "
            f"{change:+.1%} (< {search.threshold:.0%} threshold){why}")


def _baseline(search: _Search, settings: dict) -> dict:
    """The latest ok trial with exactly these settings (measured before)."""
    for trial in reversed(search.trials):
        if trial["status"] == "ok" and all(trial.get(k) == v for k, v in settings.items()) and \
                set(trial) - _MEASURED == set(settings):
            return trial
    return search.measure(**settings)


def _compare(search: _Search, settings: dict, name: str, value: Any, what: str) -> Decision | None:
    if search.over_budget():
        return Decision(name, settings.get(name), reason="not measured: the time budget ran out")
    base = _baseline(search, settings)
    trial = search.measure(**{**settings, name: value})
    gain = _gain(trial, base)
    keep = trial["status"] == "ok" and gain >= search.threshold
    chosen = value if keep else base.get(name, _DEFAULTS[name])
    reason = (f"{what}: {gain:+.1%} ({trial['samples_per_s'] or 0:,.0f} vs "
              f"{base['samples_per_s']:,.0f} samples/s); "
              + ("kept" if keep else f"below the {search.threshold:.0%} threshold, not worth it")
              if trial["status"] == "ok" else f"{what} failed: {trial['reason']}")
    return Decision(name, chosen, reason=reason, evidence={"with": trial, "without": base})


_MEASURED = {"samples_per_s", "status", "reason", "loss", "loss_parity"}  # not settings
_DEFAULTS = {"prefetch_factor": 2, "persistent_workers": False, "pin_memory": False, "batched": True}


def _choose_prefetch(search: _Search, settings: dict) -> Decision | None:
    if settings["num_workers"] == 0:
        return None
    return _compare(search, settings, "prefetch_factor", 4, "prefetch_factor=4 instead of 2")


def _choose_persistent(search: _Search, settings: dict) -> Decision | None:
    if settings["num_workers"] == 0:
        return None
    # every trial starts a fresh iterator: non-persistent workers pay their start-up in it
    return _compare(search, settings, "persistent_workers", True, "persistent workers")


def _choose_pin(search: _Search, settings: dict) -> Decision:
    if search.device.type != "cuda":
        return Decision("pin_memory", False, reason=(
            "no GPU: page-locked memory only speeds host-to-GPU copies, here it costs a copy"))
    return _compare(search, settings, "pin_memory", True, "pinned memory")


def _choose_batched(search: _Search, settings: dict) -> Decision | None:
    if not hasattr(search.dataset, "__getitems__"):
        return None  # only datasets with batched reads have the choice
    return _compare(search, {**settings, "batched": True}, "batched", False,
                    "per-sample __getitem__ instead of the batched __getitems__")
