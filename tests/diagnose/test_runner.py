"""diagnose() on planted-bottleneck scripts, run unchanged, in this process."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import looptune
from looptune.diagnose import verdict
from looptune.diagnose.rules import compute, overhead
from looptune.diagnose.rules.batch import BUSY_OVERHEAD_SHARE
from looptune.measure.records import PHASES
from looptune.diagnose.runner import parse_loader_action

SCRIPTS = Path(__file__).parent / "scripts"


def run(name, *args, **kw):
    return looptune.diagnose(str(SCRIPTS / name), list(args), **{"steps": 15, "warmup": 3, **kw})


def test_slow_getitem_is_data_loading():
    d = run("slow_getitem.py")
    assert d.bottleneck == "data_loading" and d.steps_measured == 15
    assert sum(d.shares.values()) == pytest.approx(1.0) and set(d.shares) == set(PHASES)
    assert d.shares["data_wait"] > 0.5
    assert d.remedies and d.remedies[0].expected_speedup > 1.5
    assert d.loaders[0].batch_size == 32 and d.loaders[0].dataset == "Slow"


def _wide_mlp_fixed_share(rounds=5):
    """compute_heavy.py's step timed alone at batch 256 and 1024 (interleaved rounds, medians):
    the share of the batch-256 step that does not grow with the batch, (4 t(B) - t(4B)) / 3 t(B)."""
    import statistics
    import time
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(b):
        x, y = torch.randn(b, 1024), torch.randint(0, 10, (b,))
        t = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return time.perf_counter() - t

    times = {256: [], 1024: []}
    for b in (256, 1024, 256, 1024):
        step(b)
    for _ in range(rounds):
        for b in (256, 1024, 1024, 256):
            times[b].append(step(b))
    tb, t4b = statistics.median(times[256]), statistics.median(times[1024])
    return (4 * tb - t4b) / (3 * tb)


def test_in_memory_wide_mlp_verdict_agrees_with_its_step_timed_alone():
    # compute on the VMs here (fixed share 0.03-0.16 alone and in diagnose). One CI machine ran
    # batch 1024 1.58x faster per sample than 256 (fixed share 0.50: a bigger batch does pay
    # there), so the verdict is checked against the same step timed alone, not against a constant.
    # Earlier CI failures: a slow VM phase during the steps (the model is now timed inside the
    # steps too: test_scaling.py) and a bf16 replay between B and 4B (now timed apart)
    d = run("compute_heavy.py", steps=6, warmup=2)
    alone = _wide_mlp_fixed_share()
    assert d.evidence["replay_module"] == "Sequential" and d.evidence["flops_ratio"] > 0
    assert abs(d.evidence["fixed_share"] - alone) < 0.25, (alone, d.evidence["reason"])
    if alone < BUSY_OVERHEAD_SHARE - 0.1:
        assert d.bottleneck == "compute", (alone, d.evidence["reason"])
    elif alone > BUSY_OVERHEAD_SHARE + 0.15:
        assert d.bottleneck == "overhead", (alone, d.evidence["reason"])


def test_tiny_batches_with_item_every_step_are_overhead():
    d = run("tiny_sync.py", steps=40)
    assert d.bottleneck == "overhead", d.evidence
    assert any(r.kind == "batch" for r in d.remedies)
    # .item() on a CPU tensor waits for nothing: syncs are counted for accelerator tensors only
    assert d.evidence["syncs_per_step"] == (0 if not torch.cuda.is_available() else pytest.approx(1, abs=0.5))


def test_a_script_that_raises_is_reported_with_what_was_measured():
    d = run("raises.py", steps=50)
    assert d.error == "RuntimeError: planted failure at step 12" and d.stopped == "error"
    assert 0 < d.steps_measured < 50 and d.bottleneck in {"overhead", "compute"}


def test_a_script_without_optimizer_step_gets_a_clear_error():
    with pytest.raises(looptune.MeasurementError, match="never called optimizer.step"):
        run("no_step.py")


def test_argv_path_and_patches_are_restored_and_short_runs_reported(tmp_path):
    argv, path = sys.argv[:], sys.path[:]
    out = tmp_path / "argv.txt"
    d = run("short_argv.py", "--steps", "12", "--out", str(out), steps=50)
    assert out.read_text() == f"{SCRIPTS / 'short_argv.py'} --steps 12 --out {out}"
    assert d.stopped == "script_ended" and d.steps_measured < 50
    assert sys.argv == argv and sys.path == path
    assert "item" not in torch.Tensor.__dict__ and "cpu" not in torch.Tensor.__dict__
    assert DataLoader.__iter__.__name__ == "__iter__" and DataLoader.__iter__.__module__.startswith("torch")


def test_a_rerun_imports_the_scripts_own_modules_afresh_and_keeps_packages_from_elsewhere(
        tmp_path, monkeypatch):
    # issue 32: with a package on PYTHONPATH (here also a `pip --target libs` inside the script's
    # folder), dropping it between runs while others kept its objects broke a LightningCLI rerun
    home, ext = tmp_path / "proj", tmp_path / "ext"
    (home / "libs" / "targetpkg").mkdir(parents=True)
    (ext / "extpkg").mkdir(parents=True)
    stamp = "import time\nSTAMP = time.perf_counter_ns()\n"  # when the module was imported
    (ext / "extpkg" / "__init__.py").write_text(stamp)
    (home / "libs" / "targetpkg" / "__init__.py").write_text(stamp)
    (home / "helper.py").write_text(stamp)
    out = home / "stamps.txt"
    (home / "train.py").write_text(
        "import torch\nimport extpkg, targetpkg, helper\n"
        f"open({str(out)!r}, 'a').write(f'{{extpkg.STAMP}} {{targetpkg.STAMP}} {{helper.STAMP}}\\n')\n"
        "m = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(8):\n    opt.zero_grad()\n    m(torch.ones(4, 2)).sum().backward()\n"
        "    opt.step()\n")
    monkeypatch.syspath_prepend(str(ext))
    monkeypatch.syspath_prepend(str(home / "libs"))
    for _ in range(2):
        looptune.diagnose(str(home / "train.py"), steps=3, warmup=1)
    first, second = (line.split() for line in out.read_text().splitlines())
    assert first[:2] == second[:2]  # extpkg (PYTHONPATH) and targetpkg (--target libs): kept
    assert first[2] != second[2]  # the script's own helper.py: imported afresh
    assert "helper" not in sys.modules and "extpkg" in sys.modules
    for name in ("extpkg", "targetpkg"):
        monkeypatch.delitem(sys.modules, name)


def test_dataloader_worker_processes_and_the_two_core_finding(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    d = run("workers.py", steps=20)
    assert d.loaders[0].num_workers == 2
    assert any(f.name == "workers_vs_cores" for f in d.findings)


def test_module_mode(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    d = looptune.diagnose("tiny_sync", module=True, steps=10, warmup=2)
    assert d.script == "-m tiny_sync" and d.steps_measured == 10


def test_verify_reruns_with_the_loader_remedy(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    # what is tested is the rerun with a loader remedy's settings: keep the one-worker remedy
    # listed even when a loaded VM puts its estimate under the 5% a remedy must promise to be
    # named (seen in CI: none listed, nothing rerun)
    monkeypatch.setattr(verdict, "MIN_SPEEDUP", 1.0)
    for rules in (verdict, overhead):  # the batch remedy is as large here: not this one
        monkeypatch.setattr(rules, "batch_remedy", lambda *a, **k: None)
    # the loader remedy's rerun, wherever it ranks: on a CPU with fast bf16 (Zen 5, avx512_bf16)
    # bf16 autocast outranks it (13.4 vs 21.8 ms a step)
    d = run("overlap_loader.py", steps=12, verify="loader")
    v = d.verify
    assert v["remedy"] == "DataLoader(num_workers=1, persistent_workers=True)", d.remedies
    assert v["overrides"] == {"num_workers": 1, "persistent_workers": True}
    assert v["before_step_ms"] > 0 and v["after_step_ms"] > 0
    assert v["speedup"] == pytest.approx(v["before_step_ms"] / v["after_step_ms"])


@pytest.mark.integration
def test_the_workers_bound_comes_from_one_worker_read_and_holds_when_rerun(monkeypatch):
    # loading (~8 ms of Python per batch) beside a ~10 ms one-thread step: a worker on the second
    # core overlaps them, and the bound built on its measured read must hold in the rerun. The
    # batch-size remedy (1.2-1.4x here, as large) is another rule's, tested on its own scripts:
    # left out so that --verify reruns this one. So is the bf16 remedy (the precision rule's,
    # tested on compute scripts): a CI run measured bf16 faster here and reran it instead
    for rules in (verdict, overhead):
        monkeypatch.setattr(rules, "batch_remedy", lambda *a, **k: None)
    monkeypatch.setattr(compute, "cpu_compute_remedies", lambda *a, **k: [])
    # On a loaded VM the step replayed beside a busy process can measure so slow that one worker
    # would not pay, and diagnose rightly offers none; or a slow phase during the 15-step rerun
    # hides a small promise (CI: 1.14x promised, 0.99x rerun). Either way: measure once more
    for _ in range(2):
        d = run("overlap_loader.py", steps=15, verify=True)
        offered = [r for r in d.remedies if r.kind == "loader"]
        v = d.verify
        if offered and v["kind"] == "loader" and v["applied"] and _pays(v):
            break
    assert offered, (d.bottleneck, d.evidence, d.remedies)
    (workers,) = offered
    # the script had no workers: the worker's read counts against the main process's, both read
    # back to back after the script
    assert "one worker's time per batch against the main process's" in workers.reason, \
        workers.reason
    assert v["kind"] == "loader" and v["applied"], v
    assert _pays(v), v


def _pays(v: dict) -> bool:
    """The remedy, applied, pays at least a third of its promised gain. Whether it reaches 70%
    of the promise (SHORT) is benchmarks/verdict_check.py's goal: timed, for a quiet machine."""
    return v["speedup"] - 1 >= (v["expected_speedup"] - 1) / 3


@pytest.mark.integration
def test_verify_reruns_the_pre_decode_remedy_and_its_bound_holds():
    # ~4 ms of per-sample Python per batch beside a tiny step: pre-decoding removes nearly all
    # of it; the bound comes from a pre-decoded loader of the same batch bytes, timed
    d = run("slow_getitem.py", "--samples", "6000", steps=20, verify=True)
    top = d.remedies[0]
    assert top.kind == "tensorized" and "gathered a batch in" in top.reason, d.remedies
    v = d.verify
    assert v["kind"] == "tensorized" and v["applied"] and v["top"], v
    # the remedy, applied, pays: at least a third of its promised gain. Whether it reaches 70%
    # of the promise (SHORT) is benchmarks/verdict_check.py's goal: timed, for a quiet machine
    assert v["speedup"] - 1 >= (v["expected_speedup"] - 1) / 3, v
    assert top.measured_speedup == round(v["speedup"], 2)


@pytest.mark.integration
def test_a_worker_slower_than_the_main_process_is_not_promised():
    # slow_getitem: ~0.3 ms of Python per sample and almost no step; one worker reads its batches
    # no faster than the main process (plus pickling: 5.5-6.0 vs 4.2 ms per batch here), so the
    # workers remedy cannot pay; the old bound, the main process's read / 1, promised 1.09-1.43x
    # and the rerun measured 0.71-1.21x
    d = run("slow_getitem.py", steps=12)
    assert d.bottleneck == "data_loading"
    assert all(r.expected_speedup <= 1.2 for r in d.remedies if r.kind == "loader"), d.remedies


def test_trace_writes_a_chrome_trace_and_a_top_ops_table(tmp_path):
    d = run("tiny_sync.py", steps=5, trace_dir=tmp_path / "trace")
    assert Path(d.trace["chrome_trace"]).is_file() and "aten::" in d.trace["top_ops"]


def test_probes_do_not_change_results():
    def train():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
        for x, y in DataLoader(data, batch_size=16):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            print(loss.item(), end="\r")
        return model.weight.detach().clone()

    plain = train()
    with looptune.watch(warmup=2) as w:
        watched = train()
    assert torch.equal(plain, watched)
    assert w.diagnosis.steps_measured >= 10 and w.diagnosis.bottleneck


def test_parse_loader_action():
    assert parse_loader_action("DataLoader(num_workers=3, persistent_workers=True, pin_memory=True)") == {
        "num_workers": 3, "persistent_workers": True, "pin_memory": True}
    with pytest.raises(looptune.ConfigError, match="not a DataLoader"):
        parse_loader_action("torch.compile")


def test_bad_arguments_are_reported_before_running():
    with pytest.raises(looptune.ConfigError) as info:
        looptune.diagnose("missing.py", steps=0, warmup=-1, seconds=0)
    assert len(info.value.problems) == 4 and "missing.py" in str(info.value)


def test_cli_writes_json_with_the_documented_keys(tmp_path):
    out = tmp_path / "d.json"
    proc = subprocess.run([sys.executable, "-m", "looptune", "diagnose", "--steps", "10", "--warmup", "2",
                           "--json", str(out), str(SCRIPTS / "slow_getitem.py"), "--batch-size", "16"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "bottleneck: data_loading" in proc.stdout and "remedies" in proc.stdout
    data = json.loads(out.read_text())
    for key in ("bottleneck", "shares", "step_ms", "steps_measured", "remedies", "findings", "provenance"):
        assert key in data
    assert all({"action", "expected_speedup"} <= set(r) for r in data["remedies"])
    assert data["loaders"][0]["batch_size"] == 16


def test_cli_bad_input_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "looptune", "diagnose", "--steps", "0", "nope.py"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "steps=0 is invalid" in proc.stderr and "'nope.py' does not exist" in proc.stderr


def test_cli_passes_options_after_the_script_to_the_script(tmp_path):
    out = tmp_path / "argv.txt"
    proc = subprocess.run([sys.executable, "-m", "looptune", "diagnose", "--steps", "50", "--warmup", "1",
                           str(SCRIPTS / "short_argv.py"), "--steps", "9", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().endswith("--steps 9 --out " + str(out))  # the script's --steps, not ours


def test_cli_module_mode_passes_its_arguments(tmp_path):
    out = tmp_path / "argv.txt"
    proc = subprocess.run([sys.executable, "-m", "looptune", "diagnose", "--steps", "50", "--warmup", "1",
                           "-m", "short_argv", "--steps", "9", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=SCRIPTS)
    assert proc.returncode == 0, proc.stderr
    assert "-m short_argv --steps 9" in proc.stdout and out.exists()


def test_cli_exit_code_is_1_when_the_script_raised():
    proc = subprocess.run([sys.executable, "-m", "looptune", "diagnose", "--steps", "50", "--warmup", "1",
                           str(SCRIPTS / "raises.py")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "planted failure at step 12" in proc.stdout


def test_string_arguments_are_split_like_a_shell(tmp_path):
    out = tmp_path / "argv.txt"
    looptune.diagnose(str(SCRIPTS / "short_argv.py"), f"--steps 9 --out {out}", steps=50, warmup=2)
    assert out.read_text().endswith(f"--steps 9 --out {out}")


def test_watch_lets_the_blocks_own_exception_through():
    with pytest.raises(ZeroDivisionError):
        with looptune.watch(warmup=1):
            1 / 0


def test_a_script_that_catches_base_exceptions_is_still_bounded(tmp_path):
    script = tmp_path / "greedy.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(60):\n"
        "    try:\n"
        "        o.zero_grad(); m(torch.randn(8, 4)).sum().backward(); o.step()\n"
        "    except BaseException:\n"
        "        pass\n")
    d = looptune.diagnose(str(script), steps=8, warmup=2)
    assert d.steps_measured == 8 and d.stopped == "steps"


def _check_verified(d):
    """What --verify reported must follow its own rule (diagnose/verify.py): a rerun that
    trained differently goes last with no gain; a measured gain below SHORT x the promised bound
    is reported as short and the remedies are re-ranked by what they measured; a gain at least
    that share of the promise, over a complete rerun of several steps, stands as measured.
    Returns which of these it was."""
    from looptune.diagnose.verify import SHORT

    v = d.verify
    (remedy,) = [r for r in d.remedies if r.action == v["remedy"]]
    promised = v["expected_speedup"]
    assert v["applied"] and v["after_step_ms"] > 0 and v["after_steps_measured"] >= 1
    if v["loss_parity"] is False or v.get("changes_training"):
        assert v["speedup"] is None
        if "short" in v:  # a larger batch whose throughput alone is under SHORT x the promise
            assert remedy.measured_speedup == round(v["measured_gain"], 2)
        else:
            assert d.remedies[-1] is remedy and remedy.measured_speedup is None
        return "changes the training"
    if v["speedup"] is None:  # nothing measured to compare: no gain recorded, nothing moved
        assert "short" not in v and remedy.measured_speedup is None
        return "not judged"
    assert remedy.measured_speedup == round(v["speedup"], 2)
    if v["speedup"] >= SHORT * promised:
        assert "short" not in v
        assert v["after_error"] is None and v["after_steps_measured"] >= 2
        return "delivered"
    assert v["short"] == (f"fell short: measured {v['speedup']:.2f}x, {v['speedup'] / promised:.0%} "
                          f"of the promised {promised:.2f}x (< {SHORT:.0%}): ranked by the "
                          "measured gain")
    assert v["of_promise"] == pytest.approx(v["speedup"] / promised)
    ranked = [r.measured_speedup or r.expected_speedup for r in d.remedies if r.kind != "memory"]
    assert ranked == sorted(ranked, reverse=True)  # re-ranked by what was measured
    return "fell short"


def test_verify_of_a_compute_step_reruns_bf16_or_says_nothing_can_be_applied():
    d = run("compute_heavy.py", steps=3, warmup=1, verify=True)
    if any(r.kind == "precision" for r in d.remedies):  # a CPU with fast bf16 matmuls
        assert d.verify["kind"] == "precision" and d.verify["autocast"] == "bf16"
        assert _check_verified(d) in {"delivered", "fell short", "changes the training",
                                      "not judged"}
    else:  # only torch.compile is left, which cannot be applied from outside the script
        assert d.verify["remedy"] is None and "nothing was rerun" in d.verify["reason"]
    if not torch.cuda.is_available():  # a CPU-only path: bf16 autocast('cpu'), no device
        assert not torch.cuda.is_initialized()


def test_a_bf16_rerun_that_falls_short_of_its_promise_is_reported_and_re_ranked(monkeypatch):
    """The bf16 remedy planted on top with a promise no CPU keeps (20x), and rerun for real: the
    gain it measures must be reported short of the promise and the remedies re-ranked by what
    was measured (a bf16 rerun measured at 0.46x against a 2.15x promise once passed, as long
    as a step time was measured), unless the rerun changed the training (then it goes last)."""
    import dataclasses

    from looptune.diagnose import runner
    from looptune.diagnose.rules.records import Remedy

    bf16 = Remedy(action="bf16 autocast around each forward: with torch.autocast('cpu', "
                         "dtype=torch.bfloat16): loss = loss_fn(model(x), y)",
                  expected_speedup=20.0, reason="planted promise", kind="precision")
    other = Remedy(action="torch.compile the forward (planted)", expected_speedup=5.0,
                   reason="planted", kind="compile")  # cannot be rerun from outside
    real = runner.analyze

    def analyze(m):  # the verdict as measured, its remedies replaced by the planted two
        return dataclasses.replace(real(m), remedies=[bf16, other])

    monkeypatch.setattr(runner, "analyze", analyze)
    d = run("compute_heavy.py", steps=3, warmup=1, verify=True)
    assert d.verify["remedy"] == bf16.action and d.verify["top"] and d.verify["autocast"] == "bf16"
    outcome = _check_verified(d)
    assert outcome in {"fell short", "changes the training"}, d.verify
    measured = d.remedies[[r.action for r in d.remedies].index(bf16.action)]
    if outcome == "fell short":  # ranked by its measured gain, against the other's bound
        assert measured.measured_speedup < 0.7 * 20.0
        assert [r.kind for r in d.remedies] == (["precision", "compile"]
                                               if measured.measured_speedup >= 5.0
                                               else ["compile", "precision"])
    else:
        assert [r.kind for r in d.remedies] == ["compile", "precision"]
    if not torch.cuda.is_available():
        assert not torch.cuda.is_initialized()


def test_the_pin_memory_finding_follows_what_this_torchs_dataloader_did():
    # issue 32: "pin_memory=True ... an extra copy of every batch" was false on a torch whose
    # DataLoader pins only when an accelerator is available; the fact is read from the iterator
    import warnings

    data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))

    def train():
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(data, batch_size=16, pin_memory=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own "no accelerator" warning
        d = looptune.diagnose(train, steps=8, warmup=2)
        pins = iter(DataLoader(data, batch_size=16, pin_memory=True))._pin_memory  # torch alone
    assert d.loaders[0].pin_memory is True and d.loaders[0].pinned is pins
    found = any(f.name == "pin_without_gpu" for f in d.findings)
    assert found is (pins and not torch.cuda.is_available())


@pytest.mark.parametrize("applied, needle", [
    ({"workers": 2}, "applied['workers'] is not a switch"),
    ({"autocast": "fp8"}, "applied['autocast']='fp8' is invalid"),
    ({"optimizer": ("NoSuchOpt", {})}, "applied['optimizer']"),
    ({"lr_scale": ("Adam", 0)}, "applied['lr_scale']"),
    ({"loader_overrides": [("num_workers", 1)]}, "applied['loader_overrides']"),
    ("bf16", "a dict of the rerun's switches"),
])
def test_applied_switches_are_checked_before_the_script_runs(applied, needle):
    with pytest.raises(looptune.ConfigError, match=re.escape(needle)):
        looptune.diagnose(str(SCRIPTS / "raises.py"), steps=5, applied=applied)
