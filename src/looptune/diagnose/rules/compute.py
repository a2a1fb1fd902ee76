"""Remedies for a step whose time goes to compute. On a GPU: bf16 tensor cores (an assumed
factor). On a CPU, each bounded by rates measured here:

the step's FLOPs (FlopCounterMode) at the measured fp32 matmul rate give the time its matmuls
need; the rest of the compute time is element-wise work, norms, softmax and per-op dispatch.
bf16 can only shorten the first part, by the measured bf16/fp32 matmul ratio; torch.compile
mainly the second, by fusing it. Neither bound is a guess about this CPU: both rates are
measured where the script runs, at its thread count.
"""

from __future__ import annotations

from looptune.diagnose.apply import FRAMEWORK_SWITCH
from looptune.diagnose.rules.profile import StepProfile, amdahl_remedy
from looptune.diagnose.rules.records import Remedy
from looptune.diagnose.rules.update import optimizer_s
from looptune.measure.records import Measurements

__all__ = ["BF16_CPU_FALLBACK_SAVED", "BF16_GPU_SAVED", "FUSABLE_FRACTION", "MIN_BF16_GAIN",
           "SDPA_FLASH_CPU", "bf16_action", "compute_remedies", "cpu_compute_remedies"]

# Assumed share of the non-matmul compute that inductor's fusion removes: low on purpose. An fp32
# byte-level GPT on a 2-core Zen 4 measured 1.07x from compile alone where 0.5 would have promised
# 1.38x (benchmarks/char_lm.py); with bf16 autocast, compile also fuses the casts and gained more.
FUSABLE_FRACTION = 0.2
# the share of a GPU step's compute (less the optimizer's, which stays fp32 under autocast) that
# bf16 tensor cores remove: they roughly halve it. Assumed, not measured.
BF16_GPU_SAVED = 0.5
# the share of a CPU step's compute that bf16 removes when the FLOPs or matmul rates are unknown:
# a low bound (AMX/avx512_bf16 CPUs gain more, others none). Assumed, not measured.
BF16_CPU_FALLBACK_SAVED = 0.2
# a measured bf16 matmul rate below this many times the fp32 one: no bf16 remedy (within noise).
# Assumed, not measured.
MIN_BF16_GAIN = 1.1
SDPA_FLASH_CPU = "_scaled_dot_product_flash_attention_for_cpu"


def compute_remedies(m: Measurements, p: StepProfile) -> list[Remedy]:
    """bf16 on a GPU (an assumed factor), bf16 and torch.compile on a CPU (measured bounds)."""
    c = p.shares["compute"]
    if p.on_cuda:  # the optimizer's parts stay fp32 under autocast: not halved
        u = min(c, optimizer_s(p.part_s) / p.step_s) if p.step_s > 0 else 0.0
        less = f" less the optimizer's {u:.1%}" if u > 0 else ""
        return [amdahl_remedy(
            action=bf16_action(m, "cuda")[0], share=c - u, fraction=BF16_GPU_SAVED,
            reason=f"compute is {c:.1%} of the step{less}; bf16 tensor cores roughly halve it: "
                   f"1/(1 - {c - u:.4f} x {BF16_GPU_SAVED})", kind="precision",
            estimated=True)]
    return cpu_compute_remedies(m, step_s=p.step_s, compute_s=p.phase_s["compute"],
                                update_s=optimizer_s(p.part_s))


def cpu_compute_remedies(m: Measurements, *, step_s: float, compute_s: float,
                         update_s: float = 0.0) -> list[Remedy]:
    """bf16 autocast and torch.compile remedies for a CPU step, with measured bounds; the
    fallback (no FLOP count or rates) is a low bound for bf16 alone. ``update_s``: the optimizer's
    parts of the compute (timed in the step), which compiling the forward and loss leaves as
    they are."""
    fp32, bf16, flops = m.matmul_flops_per_s, m.bf16_matmul_flops_per_s, m.flops_per_step
    if not (fp32 and flops and step_s > 0):
        c = compute_s / step_s if step_s > 0 else 0.0
        return [_bounded(
            bf16_action(m)[0] + " (only if the CPU has AMX/avx512_bf16; measure)", step_s,
            c * step_s * BF16_CPU_FALLBACK_SAVED,
            f"compute is {c:.1%} of the step; the FLOPs or matmul rates are unknown, so a low "
            f"bound: 1/(1 - {c:.4f} x {BF16_CPU_FALLBACK_SAVED})", estimated=True)]
    matmul_s = min(compute_s, flops / fp32)
    out = []
    sc = m.batch_scaling
    if sc is not None and sc.measured and sc.bf16_s:  # the model itself, replayed under bf16
        replayed = sc.replayed_s(compute_s)
        saved = replayed * (1 - sc.bf16_s / sc.small_s)
        if saved > 0:
            action, note = bf16_action(m)
            out.append(_bounded(action, step_s, saved, (
                f"{sc.module} forward+backward replayed at batch {sc.batch} under bf16 autocast: "
                f"{sc.bf16_s * 1e3:.3f} ms vs {sc.small_s * 1e3:.3f} ms in fp32 (casts "
                f"included); that part of the step's compute, {replayed * 1e3:.3f} ms, shrinks "
                f"as measured: saves {saved * 1e3:.3f} of {step_s * 1e3:.3f} ms{note}")))
    elif bf16 and bf16 >= MIN_BF16_GAIN * fp32:
        saved = matmul_s * (1 - fp32 / bf16)
        action, note = bf16_action(m)
        out.append(_bounded(action, step_s, saved, (
            f"bf16 matmuls measured {bf16 / 1e9:.3g} GFLOP/s vs fp32 {fp32 / 1e9:.3g} here; the "
            f"step's {flops:.3g} FLOP need {matmul_s * 1e3:.3f} ms at the fp32 rate, "
            f"{matmul_s * (fp32 / bf16) * 1e3:.3f} ms at the bf16 rate: saves "
            f"{saved * 1e3:.3f} of {step_s * 1e3:.3f} ms (an estimate: bf16 also halves the bytes "
            f"of element-wise ops, which this leaves out){note}")))
    rest_s = compute_s - matmul_s - update_s
    update = (f" (the optimizer's {update_s * 1e3:.3f} ms left out: compiling the forward and "
              "the loss does not touch the update)" if update_s > 0 else "")
    if rest_s > 0:
        out.append(_bounded(
            "torch.compile the forward and the loss as one function: "
            "torch.compile(lambda x, y: loss_fn(model(x), y)) (looptune step.compile=default)",
            step_s, rest_s * FUSABLE_FRACTION, (
                f"compute beyond the matmuls' time at the measured rate is {rest_s * 1e3:.3f} ms "
                f"({rest_s / step_s:.1%} of the step{update}): element-wise ops, norms, softmax and "
                f"per-op dispatch, which inductor fuses; assumed {FUSABLE_FRACTION:.0%} of it "
                "goes (more with bf16 autocast, whose casts fuse too). Compiling takes tens of "
                "seconds once (reported apart)")))
    return out


def bf16_action(m: Measurements, device: str = "cpu") -> tuple[str, str]:
    """The bf16 remedy as the script would write it: its framework's own switch when its step
    runs inside one, else autocast around each forward (one context held open across steps
    would keep its weight casts from the first step)."""
    framework = FRAMEWORK_SWITCH.get(m.framework or "")
    if framework is not None:
        return (f"bf16 through the framework's own switch: {framework[3]}",
                f"; the step runs inside {m.framework}, whose switch casts and scales as it does "
                "for its users")
    action = (f"bf16 autocast around each forward: with torch.autocast('{device}', "
              "dtype=torch.bfloat16): out = model(x); then loss = loss_fn(out.float(), y)")
    if SDPA_FLASH_CPU not in m.ops or device != "cpu":
        return action, ""
    return (action + ", with torch.nn.attention.sdpa_kernel(SDPBackend.MATH) around the forward "
            "(looptune step.attention=math)", "; the step runs scaled_dot_product_attention's CPU "
            "flash kernel, whose bf16 backward is slow: pin the math kernel with bf16")


def _bounded(action: str, step_s: float, saved_s: float, reason: str,
             estimated: bool | None = None) -> Remedy:
    """``estimated``: the bound rests on an assumed fraction (default: compile's, not bf16's)."""
    speedup = step_s / max(step_s - saved_s, 1e-12)
    bf16 = action.startswith("bf16")
    return Remedy(action=action, expected_speedup=round(speedup, 2), reason=reason,
                  kind="precision" if bf16 else "compile",
                  estimated=(not bf16) if estimated is None else estimated)
