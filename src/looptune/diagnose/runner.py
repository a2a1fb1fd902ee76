"""Run a user's training script unchanged, with probes, and diagnose it.

The script runs in this process, as ``python script.py args`` would (``__main__``, ``sys.argv``,
its folder first on ``sys.path``), until ``warmup + steps`` optimizer steps (or ``seconds``) have
been seen; then a ``StopScript`` raised from the step hook ends it. ``sys.argv``, ``sys.path``
and every patched function are restored whatever the script does.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from looptune.diagnose import env as env_probe
from looptune.diagnose.collectives import RankWaits, launched_rank
from looptune.measure.records import (
    BatchScaling, ChainTotals, Measurements, UpdateReplay, WorkerRead)
from looptune.diagnose.predecode import gather_seconds
from looptune.diagnose.result import MAX_WARMUP_STEPS, Diagnosis
from looptune.diagnose.apply import remedies_applied
from looptune.diagnose.scaling import measure_scaling, time_model_in_step, with_in_step
from looptune.diagnose.window import UNBOUNDED, MeasurementWindow
from looptune.diagnose.update_replay import described_update, measure_update
from looptune.diagnose.script import (
    Seen,
    exit_status,
    forked_children_exit_alone,
    module_exists,
    overridden_loaders,
    raised_where,
    script_env,
    script_failed,
    script_name,
)
from looptune.diagnose.verdict import analyze
from looptune.diagnose.verify import (applied_problems, 
    RERUNNABLE, apply_measured, combined, parse_loader_action, verify_remedy)
from looptune.diagnose.worker_read import measure_worker_read
from looptune.errors import ConfigError, MeasurementError
from looptune.measure.input_chain import InputChainProbes
from looptune.measure.memory import PeakMemory
from looptune.measure.probes import StepProbes, StopScript
from looptune.measure.provenance import provenance

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11

__all__ = ["FIRST_STEP_TIMEOUT_S", "check_target", "diagnose", "parse_loader_action", "watch"]

FIRST_STEP_TIMEOUT_S = 60.0  # default wait for the first step boundary before stopping a script



def check_target(target: str | Callable, *, module: bool, steps: int | None, warmup: int,
                 seconds: float | None, trace_dir: str | os.PathLike | None = None) -> list[str]:
    """Every problem with these arguments, before anything runs."""
    problems = []
    if module:
        if not module_exists(target):
            problems.append(f"-m {target!r}: no such module on sys.path or in the current "
                            "folder. Check the name, or run from the folder that holds it.")
    elif not callable(target) and not Path(target).is_file():
        problems.append(f"script {str(target)!r} does not exist or is not a file. Give the path "
                        "of the training script, e.g. looptune diagnose train.py.")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        problems.append(f"steps={steps!r} is invalid: must be an integer >= 1, e.g. --steps 50.")
    if steps is None and seconds is None:
        problems.append("give steps or seconds: how long to measure, e.g. --steps 50.")
    if trace_dir is not None and (Path(trace_dir).is_file() or _blocked(Path(trace_dir))):
        problems.append(f"trace folder {str(trace_dir)!r} cannot be created (a file is in the way "
                        "or its parent is not a writable folder). Choose another --trace DIR.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        problems.append(f"warmup={warmup!r} is invalid: must be an integer >= 0, e.g. --warmup 5.")
    if seconds is not None and not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                                    and 0 < seconds < float("inf")):
        problems.append(f"seconds={seconds!r} is invalid: a finite number > 0, e.g. --seconds 30.")
    return problems




def _blocked(folder: Path) -> bool:
    parent = next((p for p in [folder, *folder.parents] if p.exists()), None)
    return parent is None or not parent.is_dir() or not os.access(parent, os.W_OK)


@dataclass(kw_only=True)
class _ScriptRun:
    """What one run of the script gave: its measurements and how it went (diagnose() turns it
    into a Diagnosis; --verify compares reruns with it)."""

    measurements: Measurements
    stopped: str
    error: str | None
    step_s: list[float]
    peak_kind: str
    trace: dict[str, Any] | None
    total_steps: int
    wait_s: list[float] | None = None  # per measured step: blocked on other ranks
    data_wait_s: list[float] | None = None  # per measured step: blocked on the next batch
    warmup_step_s: list[float] | None = None  # the steps before the measured ones
    exit_code: int = 0  # the status `python script.py` would have exited with
    step_signal: str = "optimizer.step"  # what marked the step boundaries
    # per step from the first (warm-up included): its loss, and its wall time
    losses: list[float | None] = dataclasses.field(default_factory=list)
    all_step_s: list[float] = dataclasses.field(default_factory=list)
    measured_from: int = 0  # index of the first measured step in losses / all_step_s
    applied: int = 0  # --verify: times the remedy's switch was used in this run


def _run_once(target, args, *, module, steps, warmup, seconds, trace_dir,
              loader_overrides: dict[str, Any] | None = None, autocast: str | None = None,
              framework: str | None = None, optimizer: tuple[str, dict] | None = None,
              lr_scale: tuple[str, float] | None = None, scale: bool = True, first_step_timeout: float | None = None) -> _ScriptRun:
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    schedule = MeasurementWindow(warmup=warmup, steps=steps, seconds=seconds,
                                 trace_dir=trace_dir, device=device)
    # a rank of a distributed job: also time its waits on the other ranks (CPU/gloo only)
    waits = RankWaits(enabled=device.type == "cpu" and launched_rank()[1] > 1)

    threads: list[int] = []  # the script's intra-op threads (it may set its own), at its last step
    pid = os.getpid()

    def on_step(n: int) -> None:
        if os.getpid() != pid:  # a child the script forked: only the script's own process counts
            return
        waits.end_step()  # first: schedule.on_step may end the script
        threads[:] = [torch.get_num_threads()]
        schedule.on_step(n)

    def on_restart() -> None:  # the steps so far were backward calls, not steps
        if os.getpid() == pid:
            waits.restart()
            schedule.restart()

    probes = StepProbes(on_step=on_step, on_restart=on_restart,
                        first_step_timeout_s=first_step_timeout)
    # the model's forward + backward timed in every step, in a rerun too: its hooks cost the
    # same in both, so a tiny step's before -> after is not flattered by the rerun lacking them
    time_model_in_step(schedule, probes)
    chain, marks = InputChainProbes(), {}
    schedule.on_measuring = lambda: marks.setdefault("start", chain.snapshot())
    error, oom, exit_code, where = None, False, 0, None
    t0 = time.perf_counter()
    with (script_env(target, args, module) as run, probes, chain, waits,
          overridden_loaders(loader_overrides),
          remedies_applied(device, autocast, framework, optimizer, lr_scale) as applied):
        try:
            schedule.begin()
            forked_children_exit_alone(run, os.getpid())
        except StopScript:
            pass
        except SystemExit as exc:
            exit_code = exit_status(exc.code)
            schedule.end("script_ended" if exit_code == 0 else f"exit {exit_code}")
        except KeyboardInterrupt:  # Ctrl-C: report what was measured so far
            schedule.end("interrupted")
            exit_code = 130
        except Exception as exc:  # noqa: BLE001 - the script failed: report what was measured
            oom = isinstance(exc, torch.OutOfMemoryError)
            schedule.end("error")
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            where = raised_where(exc)
            exit_code = 1  # as python's own exit code for an uncaught exception
        finally:
            schedule.close()
            marks["end"] = chain.snapshot()  # before the replays below read the loader again
        # the model replayed at B and 4B: inside the script's environment (its threads)
        probes.paused = True  # the replay's own backward calls are no steps of the script
        probes.untime_model()
        scaling = (measure_scaling(schedule.captured, device, loader_batch=_loader_batch(probes))
                   if scale and probes.samples else None)
        # the training loader read by one worker, for the workers remedy (not in --verify reruns)
        read = (_worker_read(probes) if scale and probes.samples and probes.loaders else None)
        gather = _gather_s(probes) if scale and probes.samples and probes.loaders else None
        # the optimizer's step per implementation (the optimizer remedy); a rerun only notes
        # which implementation ran (--verify: was the remedy applied)
        update = (measure_update(probes.optimizer, device) if scale and probes.samples
                  else described_update(probes.optimizer))
        probes.optimizer = None  # the script's model and optimizer are not kept past the run
    seen = Seen(elapsed_s=time.perf_counter() - t0, batches=probes.drawn,
                loaders=len(probes.loaders), stopped=schedule.stopped, exit_code=exit_code)
    totals, note = _chain(chain, marks, probes)
    return _collect(schedule, probes, error=error, oom=oom, device=device, waits=waits.per_step,
                    where=where, script=script_name(target, args, module), input_chain=totals, input_chain_note=note,
                    threads=threads[0] if threads else None, seen=seen, scaling=scaling,
                    worker_read=read, gather_s=gather, update=update, applied=applied[0])


def _loader_batch(probes: StepProbes) -> int | None:
    """The training DataLoader's batch size (evidence for the replay's batch dimension)."""
    return probes.loaders[_training_loader(probes)].batch_size if probes.loaders else None


def _training_loader(probes: StepProbes) -> int:
    """The key of the loader the script drew the most batches from (the training loader)."""
    return max(probes.loaders, key=lambda k: probes.batches[k])


def _gather_s(probes: StepProbes) -> float | None:
    """A pre-decoded batch like the training loader's, gathered by index (predecode.py)."""
    key = _training_loader(probes)
    info, parts = probes.loaders[key], probes.loader_parts.get(key) or {}
    try:
        samples = len(parts.get("dataset"))  # type: ignore[arg-type]
    except TypeError:  # a stream: as many as a few batches
        samples = None
    return gather_seconds(batch_bytes=info.batch_bytes, batch_size=info.batch_size,
                          samples=samples)


def _worker_read(probes: StepProbes) -> WorkerRead:
    """The training loader read by one worker and, back to back, by the main process alone (the
    worker's rate relative to it: rules/workers.py)."""
    parts = probes.loader_parts.get(_training_loader(probes))
    return measure_worker_read(parts, in_process=True)




def _chain(chain: InputChainProbes, marks: dict[str, Any],
           probes: StepProbes) -> tuple[ChainTotals | None, str | None]:
    """The input chain over the measured steps, and what of it was not seen."""
    if "start" not in marks:
        return None, "the script ended before the measured steps: no input chain"
    totals = chain.totals(marks["start"], marks["end"])
    notes = []
    workers = max((info.num_workers for info in probes.loaders.values()), default=0)
    if workers and not totals.workers:
        notes.append(f"the DataLoader's {workers} worker(s) were not seen (started before "
                     "diagnose attached, or by a start method other than fork): their fetch, "
                     "collate and storage figures are missing")
    if not totals.proc:
        notes.append("no /proc here (Linux only): the wait for a CPU and the bytes read from "
                      "storage are not measured; blocked time counts as storage")
    return totals, "; ".join(notes) or None


def _collect(schedule: MeasurementWindow, probes: StepProbes, *, error, oom, device,
             input_chain: ChainTotals | None = None, input_chain_note: str | None = None,
             waits: list[float] | None = None, threads: int | None = None,
             seen: Seen | None = None, scaling: BatchScaling | None = None,
             worker_read: WorkerRead | None = None, gather_s: float | None = None,
             update: UpdateReplay | None = None, applied: int = 0, where: str | None = None,
             script: str = "") -> _ScriptRun:
    samples = probes.samples
    if not samples and probes.gave_up:
        raise MeasurementError(
            f"stopped the script: {probes.gave_up}. diagnose finds step boundaries through "
            "torch.optim optimizers, or, when the script builds none, its backward calls. Check "
            "that the script reaches its training loop with the arguments given; if its first "
            "step really takes longer, raise --first-step-timeout (first_step_timeout=).")
    if not samples and seen is not None and (error or seen.exit_code):
        raise script_failed(error, where, seen, script)
    if not samples:
        how = "" if seen is None else f" ({seen.summary()}, exit code {seen.exit_code})"
        raise MeasurementError(
            f"the script never called optimizer.step(){how}: diagnose finds step boundaries "
            "through torch.optim optimizers. Make sure the script trains with one, and that it "
            "reaches the training loop with the arguments given"
            + (f" (it raised: {error})" if error else "."))
    window = _measured(len(samples), schedule)
    measured = samples[window]
    if schedule.device_busy_s is not None:  # CUDA: split device time from host-side overhead
        measured = [dataclasses.replace(s, device_busy_s=schedule.device_busy_s) for s in measured]
    mem = schedule.memory.read() if schedule.memory else PeakMemory(device).read()
    measurements = Measurements(
        steps=measured, warmup_steps=schedule.warmup,
        loaders=[probes.loaders[k] for k in sorted(probes.loaders, key=lambda k: -probes.batches[k])],
        flops_per_step=schedule.flops,
        matmul_flops_per_s=env_probe.matmul_rate(device, threads=threads),  # the script's threads
        bf16_matmul_flops_per_s=(env_probe.matmul_rate(device, threads=threads, dtype=torch.bfloat16)
                                 if device.type == "cpu" else None),
        ops=schedule.ops,
        peak_mem_bytes=mem.peak_bytes, mem_limit_bytes=env_probe.memory_limit(device),
        alloc_retries=env_probe.alloc_retries(device), oom=oom,
        env=env_probe.environment(device, threads, capacity=bool(probes.loaders)),
        batch_scaling=with_in_step(scaling, measured, device), worker_read=worker_read,
        gather_s=gather_s, update=update, zero_grad_kept=probes.zero_grad_kept,
        framework=probes.framework, input_chain=input_chain, input_chain_note=input_chain_note)
    wait_s = None if waits is None or len(waits) != len(samples) else waits[window]
    before = samples[:window.start][-MAX_WARMUP_STEPS:]
    return _ScriptRun(
        measurements=measurements, stopped=schedule.stopped, error=error,
        step_s=[s.step_s for s in measured], peak_kind=mem.kind, trace=schedule.trace,
        total_steps=len(samples), wait_s=wait_s, data_wait_s=[s.data_wait_s for s in measured],
        warmup_step_s=[s.step_s for s in before],
        exit_code=0 if seen is None else seen.exit_code,
        step_signal=probes.signal or "optimizer.step", losses=probes.losses(),
        all_step_s=[s.step_s for s in samples], measured_from=window.start, applied=applied)


def _measured(n: int, schedule: MeasurementWindow) -> slice:
    """Which of the ``n`` samples are measured; if the script ended early, the best it allows."""
    if schedule.first_measured is not None and n > schedule.first_measured:
        first = schedule.first_measured
        return slice(first, first + schedule.steps)  # none past the limit, caught or not
    if n > schedule.warmup + 1:
        return slice(schedule.warmup + 1, n)  # skip warm-up and the FLOP-counted step
    return slice(1, n) if n > 1 else slice(0, n)




def diagnose(target: str | Callable, args: Sequence[str] | str = (), *, module: bool = False,
             steps: int | None = 50, warmup: int = 5, seconds: float | None = None,
             trace_dir: str | os.PathLike | None = None, verify: bool | str = False,
             first_step_timeout: float | None = FIRST_STEP_TIMEOUT_S,
             applied: dict[str, Any] | None = None, verify_skip: Sequence[str] = ()) -> Diagnosis:
    """Run a training script (or callable) unchanged and say where each step's time goes.

    Args:
        target: a script path, a module name with ``module=True``, or a callable.
        args: the script's command-line arguments (``sys.argv[1:]``).
        steps: optimizer steps to measure after warm-up (fewer if the script ends first);
            None with ``seconds``: measure for that long, however many steps it is.
        warmup: optimizer steps skipped before measuring (start-up, first-call costs).
        seconds: stop measuring after this long instead, if reached before ``steps``.
        trace_dir: also record a torch.profiler trace of a few steps there (Chrome/Perfetto).
        verify: rerun with the top remedy that can be applied from outside the script
            (DataLoader settings, batch size, pre-decoding, bf16, the optimizer's
            implementation) and measure before -> after, with loss parity; a remedy kind
            (e.g. ``"optimizer"``) verifies the highest-ranked remedy of that kind instead.
        first_step_timeout: seconds to wait for the first step boundary (an optimizer step,
            or a backward call when the script builds no torch.optim optimizer); past it the
            script is stopped and the error says what was seen. None: wait for the script.
        applied: remedies already applied to every run of the script, as ``--verify`` applies
            them (``loader_overrides``, ``autocast``, ``framework``, ``optimizer``,
            ``lr_scale``): what :func:`looptune.diagnose.plan.plan` carries from one round to
            the next.
        verify_skip: remedies (their actions) ``verify`` passes over: tried already.

    Returns:
        A frozen :class:`Diagnosis`: bottleneck, shares, ranked remedies, findings, evidence.
        In a rank of a distributed job (torchrun, ``looptune diagnose --nproc``) it also
        records ``rank``, ``world_size`` and, on the CPU, each step's time in collectives
        (``wait_s``); :func:`looptune.diagnose.ranks.merge_ranks` compares the ranks.

    Raises:
        ConfigError: bad arguments (before anything runs).
        MeasurementError: the script never reached a step boundary (in time).

    Example:
        >>> d = looptune.diagnose("train.py", ["--epochs", "1"], steps=30)  # doctest: +SKIP
        >>> d.bottleneck, d.remedies[0].action
    """
    problems = check_target(target, module=module, steps=steps, warmup=warmup, seconds=seconds,
                            trace_dir=trace_dir)
    if first_step_timeout is not None and not (
            isinstance(first_step_timeout, (int, float)) and not isinstance(first_step_timeout, bool)
            and 0 < first_step_timeout < float("inf")):
        problems.append(f"first_step_timeout={first_step_timeout!r} is invalid: seconds > 0 "
                        "(finite), or None to wait for the script, e.g. --first-step-timeout 120.")
    if not isinstance(verify, bool) and verify not in RERUNNABLE:
        problems.append(f"verify={verify!r} is invalid: True, False or a remedy kind that can be "
                        f"applied from outside the script: {', '.join(RERUNNABLE)}, e.g. "
                        "--verify optimizer.")
    problems += applied_problems(applied)
    if problems:
        raise ConfigError(problems)
    args = shlex.split(args) if isinstance(args, str) else list(args)  # "--lr 1" is two args
    steps = UNBOUNDED if steps is None else steps
    trace_path = None if trace_dir is None else Path(trace_dir)
    base = dict(applied or {})
    run = _run_once(target, args, module=module, steps=steps, warmup=warmup, seconds=seconds,
                    trace_dir=trace_path, first_step_timeout=first_step_timeout, **base)
    verdict = analyze(run.measurements)
    checked = None
    if verify:
        limit_s = seconds

        def rerun(*, seconds: float | None = None, **remedy):
            # seconds: the rerun of a remedy that changes the training runs that long instead
            return _run_once(target, args, module=module,
                             steps=steps if seconds is None else UNBOUNDED, warmup=warmup,
                             seconds=limit_s if seconds is None else seconds, trace_dir=None,
                             scale=False, first_step_timeout=first_step_timeout,
                             **combined(base, remedy))
        checked = verify_remedy(verdict, before=run, steps=steps, rerun=rerun,
                                prefer=None if isinstance(verify, bool) else verify,
                                skip=tuple(verify_skip))
        verdict = dataclasses.replace(verdict, remedies=apply_measured(verdict.remedies, checked))
    return _diagnosis(target=target, args=args, module=module, steps=steps, run=run,
                      verdict=verdict, checked=checked)


def _diagnosis(*, target, args, module, steps, run: _ScriptRun, verdict, checked) -> Diagnosis:
    m = run.measurements
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    rank, world = launched_rank()
    return Diagnosis(
        bottleneck=verdict.bottleneck, shares=verdict.shares, step_ms=verdict.step_ms,
        phase_ms=verdict.phase_ms, steps_measured=len(m.steps),
        steps_requested=None if steps == UNBOUNDED else steps,
        warmup_steps=m.warmup_steps, evidence=verdict.evidence, findings=verdict.findings,
        remedies=verdict.remedies, loaders=m.loaders, step_s=run.step_s,
        peak_mem_bytes=m.peak_mem_bytes, peak_mem_kind=run.peak_kind,
        script=script_name(target, args, module), stopped=run.stopped, error=run.error, verify=checked,
        trace=run.trace, provenance=provenance(device), rank=rank,
        world_size=None if rank is None else world,
        wait_s=run.wait_s, data_wait_step_s=run.data_wait_s, warmup_step_s=run.warmup_step_s or [],
        exit_code=run.exit_code, step_signal=run.step_signal, part_ms=verdict.part_ms,
        part_shares=verdict.part_shares, losses=run.losses, data_cause=verdict.data_cause,
        input_chain=verdict.input_chain)


class watch:
    """Diagnose the training code run inside ``with`` (e.g. in a notebook).

    The block runs unchanged; after it, ``w.diagnosis`` holds the same :class:`Diagnosis` as
    :func:`diagnose`. With ``steps``, the block is stopped once that many steps were measured.

    Example:
        >>> with looptune.watch(warmup=3) as w:   # doctest: +SKIP
        ...     train_one_epoch(model, loader)
        >>> w.diagnosis.bottleneck
    """

    def __init__(self, *, warmup: int = 5, steps: int | None = None, label: str = "watch") -> None:
        problems = check_target(lambda: None, module=False, steps=steps or UNBOUNDED,
                                warmup=warmup, seconds=None)
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            problems.append(f"steps={steps!r} is invalid: an integer >= 1, or None for no limit.")
        if problems:
            raise ConfigError(problems)
        self.warmup, self.steps, self.label = warmup, steps, label
        self.diagnosis: Diagnosis | None = None

    def record_loader(self, loader: Any) -> None:
        """Tell the probes about a DataLoader whose iterator was created before the block (a
        framework's fit loop); its batches' waits are measured either way."""
        self._probes.record_loader(loader)

    @property
    def steps_seen(self) -> int:
        """Optimizer steps seen so far inside the block (warm-up included)."""
        probes = getattr(self, "_probes", None)
        return 0 if probes is None else probes.steps

    @property
    def steps_measured(self) -> int:
        """Steps measured so far: after the warm-up, the FLOP-counted step and, on CUDA or with
        a trace, the profiler window's steps (0 before the measurement starts)."""
        first = getattr(getattr(self, "_schedule", None), "first_measured", None)
        return 0 if first is None else self.steps_seen - first

    def __enter__(self) -> Self:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self._schedule = MeasurementWindow(warmup=self.warmup, steps=self.steps or UNBOUNDED,
                                           seconds=None, trace_dir=None, device=device)
        self._probes = StepProbes(on_step=self._schedule.on_step,
                                  on_restart=self._schedule.restart).__enter__()
        # workers forked inside the block are seen; a framework's loader started before is not
        self._chain, self._marks = InputChainProbes().__enter__(), {}
        self._schedule.on_measuring = lambda: self._marks.setdefault(
            "start", self._chain.snapshot())
        time_model_in_step(self._schedule, self._probes)
        self._schedule.begin()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._probes.__exit__(exc_type, exc, tb)
        self._schedule.close()
        self._marks["end"] = self._chain.snapshot()
        self._chain.__exit__(exc_type, exc, tb)
        stopped = exc_type is StopScript  # the step limit ended the block: not an error
        error = None if exc is None or stopped else f"{exc_type.__name__}: {exc}"
        if error:
            self._schedule.end("error")
        if not self._probes.samples:
            return stopped  # nothing measured: the block's own exception (if any) goes on
        device = self._schedule.device
        scaling = measure_scaling(self._schedule.captured, device,  # the model at B and 4B
                                  loader_batch=_loader_batch(self._probes))
        read = _worker_read(self._probes) if self._probes.loaders else None
        gather = _gather_s(self._probes) if self._probes.loaders else None
        totals, note = _chain(self._chain, self._marks, self._probes)
        run = _collect(self._schedule, self._probes, error=error, oom=False, device=device,
                       scaling=scaling, worker_read=read, gather_s=gather, input_chain=totals,
                       input_chain_note=note)
        self.diagnosis = _diagnosis(target=self.label, args=(), module=False,
                                    steps=self.steps or UNBOUNDED, run=run,
                                    verdict=analyze(run.measurements), checked=None)
        return stopped  # any other exception propagates, after the diagnosis was taken
