"""Recipes: every knob of the training loop, as frozen dataclasses with units and trade-offs.

A :class:`Recipe` is a value: it has a name, it can be printed, compared, serialized
(:func:`dataclasses.asdict`) and it never changes. :func:`resolve` adapts a recipe to the device it
will run on and records the reason for every change it makes, so nothing is silently downgraded.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from looptune.errors import ConfigError

__all__ = [
    "Attention",
    "Backward",
    "CompileMode",
    "Decision",
    "Decode",
    "LoaderConfig",
    "LossSync",
    "ThreadPolicy",
    "Normalize",
    "OptimConfig",
    "OptimizerImpl",
    "OptimizerName",
    "Precision",
    "Recipe",
    "ScheduleConfig",
    "ScheduleName",
    "StepConfig",
    "Strategy",
    "with_overrides",
]

# Where batches come from. dataloader: a torch DataLoader in host memory, copied to the device per
# step. prefetch: a background producer readies the next batches on the device while the current
# step runs (a thread on CPU; pinned buffers and a side CUDA stream on CUDA). device: the whole
# (uint8) dataset lives on the training device, batches gathered there.
Strategy = Literal["dataloader", "prefetch", "device"]
# How samples are decoded. per_sample: the reference's __getitem__ (uint8 -> PIL -> float tensor ->
# Normalize), one Python call per sample. tensorized: decoded once into a uint8 tensor, batches
# gathered by index and normalized per batch on the training device.
Decode = Literal["per_sample", "tensorized"]
# When a device-resident dataset is normalized. batch: kept as uint8 (4x less memory), each batch
# converted and normalized on the device per step. once: normalized to float32 once at setup
# (4x the memory), each batch gathered ready to use: no per-step conversion (not with augmentation).
Normalize = Literal["batch", "once"]
Store = Literal["float32", "autocast"]
# How a per-sample pipeline over image files decodes each JPEG (workloads that read files, e.g.
# jpeg-folder). pil: Pillow, full size. draft: Pillow's JPEG draft mode, the crop decoded at the
# smallest 1/2, 1/4 or 1/8 scale that keeps it at training resolution. simplejpeg: libjpeg-turbo
# through simplejpeg, at that scale too (pip install 'looptune[jpeg]').
ImageDecoder = Literal["pil", "draft", "simplejpeg"]
# When the step's loss is read on the host. step: loss.item() every step (the reference; a device
# sync per step on CUDA). epoch: summed on the device, read once per epoch.
LossSync = Literal["step", "epoch"]
# fixed: cpu_threads (or torch's default) all run long; adaptive: follows the faster count as
# measured while training (fastpath/threads.py)
ThreadPolicy = Literal["fixed", "adaptive"]
# Autocast compute dtype. fp16 needs a GradScaler (looptune adds one); bf16 does not.
Precision = Literal["fp32", "bf16", "fp16"]
# How gradients are computed. autograd: recorded and replayed by torch.autograd. mlp: a chain of
# Linear/ReLU layers under cross-entropy, forward and backward written out (fastpath/mlp.py): the
# same kernels without autograd's per-step graph; under bf16, each layer in bf16 only where its
# matmuls measured faster that way; with compile, the written-out step is one compiled graph.
# mlp-cpp: the same written-out step as one C++ call (fastpath/mlp_step.cpp, built at setup;
# without a compiler it runs from Python, as mlp, with the reason).
Backward = Literal["autograd", "mlp", "mlp-cpp"]
# torch.compile mode; "off" runs eagerly.
CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune"]
# torch.nn.functional.scaled_dot_product_attention's kernel: "auto" = PyTorch's own choice
Attention = Literal["auto", "math", "flash", "efficient", "cudnn"]
CUDA_ONLY_ATTENTION = ("efficient", "cudnn")  # SDPA kernels that exist only on CUDA
OptimizerName = Literal["sgd", "adam", "adamw"]
# auto: torch's default; foreach: one kernel per op over all params; fused: one kernel per step;
# direct: the fused kernel called directly, without torch's per-step Python bookkeeping (Adam and
# AdamW; the same update bit for bit, see fastpath/direct.py); for-loop: per-parameter ops (the
# slowest, the most portable).
OptimizerImpl = Literal["auto", "foreach", "fused", "direct", "for-loop"]
ScheduleName = Literal["constant", "cosine", "onecycle", "cyclic", "step"]


@dataclass(frozen=True)
class Decision:
    """An automatic choice and why it was made (DESIGN.md convention 6)."""

    name: str  # the setting decided, e.g. "pin_memory"
    value: Any  # the value chosen
    _: dataclasses.KW_ONLY  # Decision("num_workers", 2, reason=..., evidence=...)
    reason: str  # one sentence a user can check
    evidence: Any = None  # measurements behind it, if any


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How training batches are produced and moved to the device."""

    strategy: Strategy = "dataloader"
    decode: Decode = "per_sample"
    batch_size: int = 64  # samples per step; bigger = fewer launches and copies, other optimum
    num_workers: int = 0  # DataLoader worker processes; 0 = load in the training process
    pin_memory: bool = False  # page-locked host batches: faster, async host-to-GPU copies
    non_blocking: bool = False  # .to(device, non_blocking=...): overlaps copies when pinned
    prefetch_factor: int | None = None  # batches each worker keeps ready (None = torch default 2)
    persistent_workers: bool = False  # keep workers between epochs (saves the start-up per epoch)
    drop_last: bool = False  # the reference keeps the last partial batch (60000 = 937 x 64 + 32)
    timeout_s: float = 0.0  # workers: end the run when a batch takes longer (0 = wait forever)
    normalize: Normalize = "batch"  # device strategy: per batch from uint8, or once at setup
    # normalize='once': keep the dataset in float32, or in the step's autocast dtype when the
    # model's forward is bit-identical that way (checked at setup; data/store.py)
    store: Store = "float32"
    image_decoder: ImageDecoder = "pil"  # decode='per_sample' over image files: how JPEGs decode

    def problems(self) -> list[str]:
        """Every invalid field, as a message with the received value, what is allowed and the fix."""
        out = _literal_problems(self, {"strategy": Strategy, "decode": Decode,
                                      "normalize": Normalize, "store": Store,
                                      "image_decoder": ImageDecoder})
        if self.image_decoder != "pil" and self.decode != "per_sample":
            out.append(f"image_decoder={self.image_decoder!r} needs decode='per_sample' (got "
                       f"decode={self.decode!r}): a tensorized dataset was decoded once already. "
                       "Use decode='per_sample', or image_decoder='pil'.")
        if self.image_decoder == "simplejpeg" and importlib.util.find_spec("simplejpeg") is None:
            out.append("image_decoder='simplejpeg' needs the simplejpeg package (libjpeg-turbo): "
                       "pip install 'looptune[jpeg]', or use image_decoder='draft'.")
        if self.store == "autocast" and self.normalize != "once":
            out.append(f"store='autocast' needs normalize='once' (got normalize="
                       f"{self.normalize!r}): only a dataset normalized once is kept in float. "
                       "Use normalize='once' with strategy='device', or store='float32'.")
        if self.normalize == "once" and self.strategy != "device":
            out.append(f"normalize='once' needs strategy='device' (got strategy="
                       f"{self.strategy!r}): it keeps the whole normalized dataset on the device. "
                       "Use strategy='device', or normalize='batch'.")
        if not _is_int(self.batch_size) or self.batch_size < 1:
            out.append(f"batch_size={self.batch_size!r} is invalid: must be an integer >= 1.")
        if not _is_int(self.num_workers) or self.num_workers < 0:
            out.append(f"num_workers={self.num_workers!r} is invalid: must be >= 0. "
                       "Use 0 to load in the main process.")
        if (isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float))
                or not 0 <= self.timeout_s < float("inf")):
            out.append(f"timeout_s={self.timeout_s!r} is invalid: seconds >= 0 (0 = no timeout). "
                       "Set e.g. timeout_s=120.")
        if self.prefetch_factor is not None and (not _is_int(self.prefetch_factor)
                                                 or self.prefetch_factor < 1):
            out.append(f"prefetch_factor={self.prefetch_factor!r} is invalid: must be >= 1 or None.")
        uses_workers = self.strategy == "dataloader" and _is_int(self.num_workers) and self.num_workers > 0
        if not uses_workers and self.persistent_workers:
            out.append("persistent_workers needs DataLoader workers: got "
                       f"num_workers={self.num_workers!r} with strategy={self.strategy!r}. "
                       "Set num_workers >= 1 or drop persistent_workers.")
        if not uses_workers and self.strategy != "prefetch" and self.prefetch_factor is not None:
            out.append(f"prefetch_factor={self.prefetch_factor!r} needs DataLoader workers or "
                       f"strategy='prefetch' (got num_workers={self.num_workers!r}, strategy="
                       f"{self.strategy!r}). Set num_workers >= 1, or drop prefetch_factor.")
        if self.strategy in ("prefetch", "device") and self.decode != "tensorized":
            out.append(f"strategy={self.strategy!r} needs decode='tensorized' (got "
                       f"decode={self.decode!r}): it gathers whole batches from a decoded tensor. "
                       "Use decode='tensorized', or strategy='dataloader' for per-sample decoding.")
        return out


@dataclass(frozen=True, kw_only=True)
class StepConfig:
    """How one training step computes: precision, accumulation, compilation, CUDA graphs."""

    precision: Precision = "fp32"  # autocast dtype; bf16/fp16 halve activation bytes
    accumulate: int = 1  # micro-batches per optimizer step: effective batch = accumulate x batch
    compile: CompileMode = "off"  # torch.compile mode; compile time is reported apart
    cuda_graphs: bool = False  # capture the whole step once, replay it: no per-kernel launches
    channels_last: bool = False  # conv nets: NHWC weights and 4-D inputs (oneDNN's and cuDNN's fast layout)
    attention: Attention = "auto"  # the kernel behind F.scaled_dot_product_attention (sdpa_kernel)
    backward: Backward = "autograd"  # "mlp"/"mlp-cpp": a Linear/ReLU chain's step written out
    max_consecutive_skips: int = 20  # fp16: stop after this many overflow-skipped steps in a row
    stop_on_nonfinite: bool = True  # stop at a NaN/inf loss, naming epoch, step and batch

    def problems(self) -> list[str]:
        out = _literal_problems(self, {"precision": Precision, "compile": CompileMode,
                                      "attention": Attention, "backward": Backward})
        if self.backward in ("mlp", "mlp-cpp"):
            clash = {"precision='fp16'": self.precision == "fp16",
                     "cuda_graphs=True": self.cuda_graphs}
            out += [f"backward={self.backward!r} with {what}: the written-out step runs in fp32 "
                    "or bf16, without a GradScaler, and is not captured as a CUDA graph. Use "
                    f"backward='autograd' for {what}." for what, bad in clash.items() if bad]
        if self.backward == "mlp-cpp" and self.compile != "off":
            out.append(f"backward='mlp-cpp' with compile={self.compile!r}: the C++ step is not "
                       "compiled by torch.compile. Use backward='mlp' to compile the written-out "
                       "step, or compile='off'.")
        if not _is_int(self.accumulate) or self.accumulate < 1:
            out.append(f"accumulate={self.accumulate!r} is invalid: must be an integer >= 1 "
                       "(1 = an optimizer step per batch).")
        if not _is_int(self.max_consecutive_skips) or self.max_consecutive_skips < 1:
            out.append(f"max_consecutive_skips={self.max_consecutive_skips!r} is invalid: "
                       "must be an integer >= 1.")
        if self.cuda_graphs and self.accumulate > 1:
            out.append(f"cuda_graphs=True with accumulate={self.accumulate}: a captured step is "
                       "one whole optimizer step. Use accumulate=1 or cuda_graphs=False.")
        if self.cuda_graphs and self.precision == "fp16":
            out.append("cuda_graphs=True with precision='fp16': the GradScaler's inf check syncs "
                       "the host, which a captured graph cannot do. Use precision='bf16'.")
        if self.cuda_graphs and self.compile != "off":
            out.append(f"cuda_graphs=True with compile={self.compile!r}: pick one; "
                       "compile='reduce-overhead' already uses CUDA graphs.")
        return out


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """The optimizer. The reference uses Adam with lr=1e-3."""

    name: OptimizerName = "adam"
    impl: OptimizerImpl = "auto"  # kernel strategy for the update, see OptimizerImpl
    lr: float = 1e-3  # peak learning rate (schedules scale it by a factor in [0, 1])
    weight_decay: float = 0.0  # adam/sgd: L2 added to the gradient; adamw: decoupled decay
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only: Nesterov momentum (needs momentum > 0)
    betas: tuple[float, float] = (0.9, 0.999)  # adam/adamw: decay of the moment estimates

    def problems(self) -> list[str]:
        out = _literal_problems(self, {"name": OptimizerName, "impl": OptimizerImpl})
        if not (_is_number(self.lr) and self.lr > 0):
            out.append(f"lr={self.lr!r} is invalid: must be a number > 0, e.g. 1e-3.")
        if not (_is_number(self.weight_decay) and self.weight_decay >= 0):
            out.append(f"weight_decay={self.weight_decay!r} is invalid: must be >= 0.")
        if not (_is_number(self.momentum) and 0 <= self.momentum < 1):
            out.append(f"momentum={self.momentum!r} is invalid: must be in [0, 1).")
        if self.nesterov and (self.name != "sgd" or self.momentum == 0):
            out.append(f"nesterov=True needs optimizer 'sgd' with momentum > 0 (got "
                       f"{self.name!r}, momentum={self.momentum!r}).")
        if not (len(self.betas) == 2 and all(_is_number(b) and 0 <= b < 1 for b in self.betas)):
            out.append(f"betas={self.betas!r} is invalid: two numbers in [0, 1), e.g. (0.9, 0.999).")
        return out


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """The learning-rate schedule: a factor of ``OptimConfig.lr``, stepped per optimizer step."""

    name: ScheduleName = "constant"
    warmup_steps: int = 0  # linear ramp from lr/warmup_steps to lr over the first steps
    min_lr_fraction: float = 0.0  # cosine/onecycle/cyclic: the lowest factor reached
    pct_start: float = 0.25  # onecycle: share of the steps spent rising to the peak
    cycle_steps: int = 2000  # cyclic: steps per full triangle (up and down)
    step_size: int = 1000  # step: optimizer steps between decays
    gamma: float = 0.1  # step: factor applied at each decay

    def problems(self) -> list[str]:
        out = _literal_problems(self, {"name": ScheduleName})
        for name in ("warmup_steps", "cycle_steps", "step_size"):
            value, low = getattr(self, name), 0 if name == "warmup_steps" else 1
            if not _is_int(value) or value < low:
                out.append(f"{name}={value!r} is invalid: must be an integer >= {low}.")
        for name, low, high in (("min_lr_fraction", 0, 1), ("pct_start", 0, 1), ("gamma", 0, 1)):
            value = getattr(self, name)
            if not (_is_number(value) and low <= value <= high):
                out.append(f"{name}={value!r} is invalid: must be in [{low}, {high}].")
        return out


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Every knob of one training run. ``name`` identifies it in tables and JSON."""

    name: str
    description: str = ""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    step: StepConfig = field(default_factory=StepConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    loss_sync: LossSync = "step"
    cpu_threads: int | None = None  # torch intra-op threads; None = torch's default (all cores)
    thread_policy: ThreadPolicy = "fixed"  # adaptive: cpu_threads is where the run starts
    reasons: tuple[Decision, ...] = ()  # why a preset chose its settings (shown with results)

    def problems(self) -> list[str]:
        out = (self.loader.problems() + self.step.problems() + self.optim.problems()
               + self.schedule.problems() + _literal_problems(self, {"loss_sync": LossSync,
                                                           "thread_policy": ThreadPolicy}))
        if self.loader.store == "autocast" and self.step.precision not in ("bf16", "fp16"):
            out.append(f"loader.store='autocast' needs step.precision bf16 or fp16 (got "
                       f"{self.step.precision!r}): in fp32 there is no autocast dtype to keep the "
                       "dataset in. Set step.precision=bf16, or loader.store=float32.")
        if self.cpu_threads is not None and (not _is_int(self.cpu_threads) or self.cpu_threads < 1):
            out.append(f"cpu_threads={self.cpu_threads!r} is invalid: an integer >= 1, or None "
                       "for torch's default.")
        return out

    def validate(self) -> Recipe:
        """Raise :class:`ConfigError` listing every problem at once; return self when valid."""
        found = self.problems()
        if found:
            raise ConfigError([f"recipe {self.name!r}: {p}" for p in found])
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (tuples become lists), so a JSON round trip gives an equal dict."""
        return _jsonable(dataclasses.asdict(self))


def _literal_problems(obj: Any, fields: dict[str, Any]) -> list[str]:
    out = []
    for name, literal in fields.items():
        value, allowed = getattr(obj, name), get_args(literal)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            fix = (f"did you mean {name}={close[0]!r}?" if close
                   else f"set {name} to one of them.")
            out.append(f"{name}={value!r} is invalid: allowed values are "
                       f"{', '.join(map(repr, allowed))}; {fix}")
    return out


def with_overrides(recipe: Recipe, assignments: list[str]) -> Recipe:
    """``recipe`` with ``PART.FIELD=VALUE`` assignments applied (e.g. ``step.precision=bf16``,
    ``loader.batch_size=256``, ``optim.lr=3e-3``, ``cpu_threads=1``); all problems reported at once.

    Example:
        >>> with_overrides(Recipe(name="r"), ["optim.impl=fused"]).optim.impl
        'fused'
    """
    problems, changes = [], {}
    for text in assignments:
        try:
            path, value = _parse_assignment(recipe, text)
        except ConfigError as err:
            problems += err.problems
            continue
        changes[path] = value
    if problems:
        raise ConfigError(problems)
    for (part, name), value in changes.items():
        if part is None:
            recipe = dataclasses.replace(recipe, **{name: value})
        else:
            sub = dataclasses.replace(getattr(recipe, part), **{name: value})
            recipe = dataclasses.replace(recipe, **{part: sub})
    return recipe


_PARTS = ("loader", "step", "optim", "schedule")


def _parse_assignment(recipe: Recipe, text: str) -> tuple[tuple[str | None, str], Any]:
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    target = recipe if len(parts) == 1 else getattr(recipe, parts[0], None)
    fields = {f.name for f in dataclasses.fields(target)} if dataclasses.is_dataclass(target) else set()
    settable = fields - {"name", "description", "reasons", *_PARTS}
    if not sep or len(parts) > 2 or (len(parts) == 2 and parts[0] not in _PARTS) or parts[-1] not in settable:
        known = [f"{p}.{f.name}" for p in _PARTS for f in dataclasses.fields(getattr(recipe, p))]
        raise ConfigError(f"--set {text!r} is invalid: expected FIELD=VALUE with FIELD one of "
                          f"{', '.join(known + ['loss_sync', 'cpu_threads', 'thread_policy'])}.")
    declared = typing.get_type_hints(type(target))[parts[-1]]
    return (parts[0] if len(parts) == 2 else None, parts[-1]), _convert(raw.strip(), declared, text)


def _convert(raw: str, declared: Any, text: str) -> Any:
    """``raw`` as the field's declared type (``int | None``, ``float``, a Literal, ...)."""
    args = get_args(declared)
    optional = typing.get_origin(declared) in (typing.Union, types.UnionType) and type(None) in args
    kind = next(a for a in args if a is not type(None)) if optional else declared
    if raw.lower() in ("none", "null"):
        if optional:
            return None
        raise ConfigError(f"--set {text!r}: this field cannot be None; give a value of type "
                          f"{_type_name(kind)}.")
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "yes")
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        if typing.get_origin(kind) is tuple:
            return tuple(float(v) for v in raw.split(","))
    except ValueError:
        raise ConfigError(f"--set {text!r}: {raw!r} is not a valid {_type_name(kind)}"
                          + (" (or None)." if optional else ".")) from None
    return raw  # a Literal's string: the recipe's checks list the allowed values


def _type_name(kind: Any) -> str:
    if typing.get_origin(kind) is tuple:
        return "comma-separated list of numbers, e.g. 0.9,0.999"
    if typing.get_origin(kind) is Literal:
        return "one of " + ", ".join(map(repr, get_args(kind)))
    return getattr(kind, "__name__", str(kind))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A finite int or float (nan and inf are never a setting)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
