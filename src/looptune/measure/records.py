"""What the probes measured about a training script: per-step samples, the loader, the
environment, the batch-size and update replays (:class:`Measurements`). Pure data, JSON-ready, no
torch; units in the field names. The diagnosis's rules read these records; nothing here knows
about verdicts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["PHASES", "BatchScaling", "ChainTotals", "Environment", "LoaderInfo", "Measurements", "Phase",
           "StepSample", "UpdateReplay", "WorkerRead"]

# the phases one step's wall time is split into (they sum to the step time)
Phase = Literal["data_wait", "host_to_device", "sync", "compute", "other"]
PHASES: tuple[str, ...] = ("data_wait", "host_to_device", "sync", "compute", "other")


@dataclass(frozen=True, kw_only=True)
class StepSample:
    """One optimizer step, from the end of the previous step to the end of this one."""

    step_s: float  # wall time of the whole interval
    data_wait_s: float = 0.0  # blocked in next() on a DataLoader (or the script's batch iterator)
    h2d_s: float = 0.0  # host time inside host-to-device copies (.to/.cuda to a GPU)
    h2d_bytes: int = 0  # bytes copied host -> device
    h2d_pageable_bytes: int = 0  # of those, from pageable (not pinned) host memory
    sync_s: float = 0.0  # host time blocked in syncs (.item(), .cpu(), .tolist(), printing tensors)
    syncs: int = 0  # number of such calls
    device_busy_s: float | None = None  # CUDA: GPU time between the step's events; None on CPU
    # host time from the replayed model's forward to the end of its backward, summed over its
    # calls in the step (accumulation: several); None before the model is known (the FLOP step)
    model_s: float | None = None
    # the step's own parts (measure/probes.py PART_NAMES), host seconds each, timed exclusively:
    # forward (with the loss; only once the model is known), backward, optimizer (the update),
    # zero_grad, clip_grad, grad_scaler, lr_scheduler; a part the step did not run is absent
    parts_s: dict[str, float] = field(default_factory=dict)
    loss: float | None = None  # the loss the step's backward started from (mean over its calls)


@dataclass(frozen=True, kw_only=True)
class LoaderInfo:
    """The settings of one DataLoader the script iterated."""

    batch_size: int | None
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    dataset: str  # type name of the dataset
    batch_bytes: int | None = None  # bytes of one collated batch (tensors only), if seen
    # dataset[0] read twice gave different tensors: a random per-sample transform (augmentation)
    random_per_sample: bool | None = None
    samples: int | None = None  # len(dataset); None for a stream
    # whether this torch's DataLoader iterator pinned the batches (read from the iterator the
    # script made: torch >= 2.x pins only when an accelerator is available, whatever pin_memory
    # says); None: not seen (an iterator made before the probes went on)
    pinned: bool | None = None


@dataclass(frozen=True, kw_only=True)
class Environment:
    cpu_count: int
    device_type: str  # "cpu" or "cuda"
    device_name: str
    device_total_bytes: int | None = None  # GPU memory; None on CPU
    shm_bytes: int | None = None  # size of /dev/shm (DataLoader workers pass batches through it)
    tf32_supported: bool | None = None  # GPU has TF32 (compute capability >= 8.0)
    tf32_enabled: bool | None = None  # torch.backends.cuda.matmul.allow_tf32 / precision "high"
    threads: int | None = None  # the training process's intra-op threads (torch.get_num_threads)
    # cores of CPU work the machine delivered to cpu_count busy processes at once (measured after
    # the script; below cpu_count on a VM whose host lends its vCPUs to others); None: not measured
    cpu_capacity: float | None = None


@dataclass(frozen=True, kw_only=True)
class BatchScaling:
    """The step's model, forward + backward, replayed at the step's batch and ``factor`` x it
    (:mod:`looptune.diagnose.scaling`): how its time grows with the batch, measured."""

    batch: int | None  # the leading dimension of the model's input in the step
    factor: int  # the larger batch is factor x batch
    module: str | None = None  # the replayed module's type name
    calls_per_step: int = 1  # calls of that module per optimizer step (accumulation: several)
    small_s: float | None = None  # seconds per forward + backward at ``batch``
    large_s: float | None = None  # the same at ``factor x batch``
    bf16_s: float | None = None  # the same at ``batch`` under bf16 autocast
    # the same at ``batch`` beside one busy process (a DataLoader worker's share of the CPU)
    beside_busy_s: float | None = None
    # CPU: the same module's forward(s) + backward as they ran inside the script's measured steps
    # (median per step, host clock): the replay's share of the step's compute, timed in the same
    # seconds as the rest of the step (a VM's slow phase during the script then scales both)
    in_step_s: float | None = None
    note: str | None = None  # why it was not measured
    # which dimension of the input is the batch, and the evidence that decided it (the
    # DataLoader's batch size, a sequence layer's batch_first, the leading dimension); None: the
    # evidence could not place it, and no batch-size promise is made
    batch_dim: int | None = 0
    batch_evidence: str | None = None
    modules: int = 1  # trained modules replayed together (a GAN's generator and discriminator)
    # several modules: each one's forward(s) + backward per step at ``batch``, replayed alone
    # ("3x Discriminator": its three calls), in the order the step first called them
    module_s: dict[str, float] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return bool(self.batch and self.small_s and self.large_s)

    def replayed_s(self, compute_s: float) -> float:
        """The part of the step's ``compute_s`` the replay stands for: the forward(s) and
        backward as timed in the script's own steps when known, else the replay's time per
        step (the replay may run slower than in-step); never more than the compute."""
        own = self.in_step_s if self.in_step_s else self.calls_per_step * (self.small_s or 0.0)
        return min(compute_s, own)

    @property
    def per_sample_gain(self) -> float:
        """Time per sample at ``batch`` / time per sample at ``factor x batch``."""
        return self.factor * self.small_s / self.large_s  # type: ignore[operator]


@dataclass(frozen=True, kw_only=True)
class WorkerRead:
    """The script's training DataLoader read by one worker process after the script stopped, the
    main process only taking the batches (:mod:`looptune.diagnose.worker_read`)."""

    batch_s: float | None = None  # seconds per batch one worker delivers, in steady state
    receive_s: float | None = None  # main-process seconds to take a batch the worker has ready
    batches: int = 0  # batches timed
    start_s: float | None = None  # the worker's start-up and its first batch
    # seconds per batch read in the main process (num_workers=0); measured when the script used
    # workers (without them its data wait is that read)
    main_s: float | None = None
    note: str | None = None  # why it was not measured

    @property
    def measured(self) -> bool:
        return bool(self.batch_s and self.receive_s is not None)


@dataclass(frozen=True, kw_only=True)
class ChainTotals:
    """The input chain inside the data wait (:mod:`looptune.measure.input_chain`): sums between
    the measurement window's start and end over the processes that fetched (seconds, bytes)."""

    batches: int
    workers: int  # worker processes that fetched at least one batch
    main_batches: int  # batches fetched by the main process itself (num_workers=0)
    fetch_s: float  # wall time in the dataset
    fetch_cpu_s: float  # of which the fetching thread ran on a CPU
    fetch_runq_s: float  # of which it was runnable, waiting for a CPU
    read_bytes: float  # bytes the storage device delivered to the fetching threads
    rchar: float  # bytes they read, page cache included
    collate_s: float
    collate_cpu_s: float
    other_cpu_s: float  # the workers' other threads (the feeder thread pickling batches)
    receive_s: float  # main process: CPU receiving + unpickling batches
    receives: int
    pin_s: float  # main process: CPU in the pin-memory step
    pins: int
    main_run_s: float  # the main process's threads (the training step's) on a CPU
    main_runq_s: float  # ... runnable, waiting for a CPU
    proc: bool  # /proc was readable: the waits for a CPU and the bytes are measured

    def per_batch(self, seconds: float) -> float:
        return seconds / self.batches if self.batches else 0.0

    @property
    def blocked_s(self) -> float:
        """Fetch time neither on a CPU nor waiting for one: storage (or a lock, a sleep)."""
        return max(0.0, self.fetch_s - self.fetch_cpu_s - self.fetch_runq_s)

    @property
    def links_s(self) -> dict[str, float]:
        """Seconds per batch of each link of the chain (worker seconds: with several workers
        they overlap each other): storage (blocked in the dataset), decode (the dataset on a
        CPU), collate, transfer (pickling in the worker, receiving + unpickling and pinning in
        the main process) and contention (fetch and collate waiting for a CPU)."""
        return {"storage": self.per_batch(self.blocked_s),
                "decode": self.per_batch(self.fetch_cpu_s),
                "collate": self.per_batch(self.collate_cpu_s),
                "transfer": self.per_batch(self.other_cpu_s + self.receive_s + self.pin_s),
                "contention": self.per_batch(self.fetch_runq_s
                                             + max(0.0, self.collate_s - self.collate_cpu_s))}


@dataclass(frozen=True, kw_only=True)
class UpdateReplay:
    """The script's optimizer step replayed after the script stopped, on copies of its own
    parameters and gradients, under each implementation its class offers
    (:mod:`looptune.diagnose.update_replay`)."""

    optimizer: str  # the optimizer's class name, e.g. "AdamW"
    impl: str  # the script's implementation: "for-loop" | "foreach" | "fused"
    params: int = 0  # parameter tensors it updates
    elements: int = 0  # their elements
    # seconds per optimizer step, per implementation measured ("for-loop", "foreach", "fused")
    step_s: dict[str, float] = field(default_factory=dict)
    # seconds per step of the script's implementation on as many 1-element tensors: the update's
    # fixed per-op cost (dispatch, the Python loop), which does not depend on the tensors' sizes
    dispatch_s: float | None = None
    # why an implementation was not measured (unsupported here, failed), per implementation
    skipped: dict[str, str] = field(default_factory=dict)
    note: str | None = None  # why nothing was replayed

    @property
    def best(self) -> str | None:
        """The fastest implementation measured (None when none was)."""
        return min(self.step_s, key=self.step_s.__getitem__) if self.step_s else None


@dataclass(frozen=True, kw_only=True)
class Measurements:
    """Everything the probes measured over the measured (post-warm-up) steps."""

    steps: list[StepSample]
    warmup_steps: int
    loaders: list[LoaderInfo] = field(default_factory=list)
    flops_per_step: float | None = None  # FlopCounterMode count of one training step
    matmul_flops_per_s: float | None = None  # measured rate of a large matmul on this device
    bf16_matmul_flops_per_s: float | None = None  # the same matmul in bf16 (CPU: measured too)
    ops: frozenset[str] = frozenset()  # aten ops of the FLOP-counted step (e.g. the SDPA kernel)
    peak_mem_bytes: int | None = None
    mem_limit_bytes: int | None = None  # device memory (CUDA) or physical RAM (CPU)
    alloc_retries: int = 0  # CUDA caching-allocator retries (cudaMalloc failed, cache flushed)
    oom: bool = False  # an out-of-memory error stopped the script
    env: Environment | None = None
    batch_scaling: BatchScaling | None = None  # the model replayed at B and k x B
    worker_read: WorkerRead | None = None  # the training DataLoader read by one worker, measured
    # seconds per batch from a DataLoader over a pre-decoded dataset of the same batch bytes and
    # samples (diagnose/predecode.py): what the pre-decode remedy leaves of the data wait
    gather_s: float | None = None
    update: UpdateReplay | None = None  # the optimizer step replayed per implementation
    input_chain: ChainTotals | None = None  # the links inside the data wait, measured
    input_chain_note: str | None = None  # why the chain was not (wholly) seen
    zero_grad_kept: bool = False  # the script called zero_grad(set_to_none=False)
    # the training framework whose code called optimizer.step ("transformers",
    # "lightning.pytorch", "lightning.fabric", "accelerate"); None: the script's own loop
    framework: str | None = None
