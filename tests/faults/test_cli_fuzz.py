"""Fault case 13: fuzz the CLI's ``--set PART.FIELD=VALUE``, recipe names and numeric flags.

Every value either passes the checks (the run would start: the expensive call is replaced by a
sentinel) or gets exit 2 and a message that names it; never a traceback. Bounded: a fixed number
of examples per property, derandomized so CI sees the same cases every run.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from looptune.cli import bench as bench_cli
from looptune.cli import diagnose as diagnose_cli
from looptune.cli import tune as tune_cli
from looptune.cli.main import main
from looptune.recipe import Recipe

# LOOPTUNE_FUZZ_EXAMPLES=5000 for a longer, random search (CI: 150 fixed examples per property)
_LONG = os.environ.get("LOOPTUNE_FUZZ_EXAMPLES")
FUZZ = settings(max_examples=int(_LONG or 150), deadline=None, derandomize=not _LONG, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


class WouldRun(Exception):
    """Raised instead of the expensive call: every check before it passed."""


@pytest.fixture
def no_runs(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise WouldRun
    for module, name in ((bench_cli, "bench"), (bench_cli, "_launch"),
                         (diagnose_cli, "diagnose"), (diagnose_cli, "_launch_ranks"),
                         (tune_cli, "_workload")):  # tune: loading the data is the expense
        if hasattr(module, name):
            monkeypatch.setattr(module, name, refuse)
    from looptune.data import mnist
    monkeypatch.setattr(mnist, "verify", lambda data_dir=None: None)  # arguments, not data
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    return script


def run_cli(argv: list[str], capsys) -> tuple[int | str, str]:
    """(exit code or "ran", stderr). Any exception other than the sentinel fails the test."""
    try:
        code = main(argv)
    except WouldRun:
        return "ran", capsys.readouterr().err
    except SystemExit as exc:  # argparse: usage errors exit 2 with its message
        code = exc.code
    return code, capsys.readouterr().err


def named(value: str, err: str) -> bool:
    """The message names the value: as typed, or as Python shows it (repr escapes the odd)."""
    shown = [value, repr(value), repr(value)[1:-1], value.strip(), repr(value.strip())[1:-1]]
    try:  # "00" shown as steps=0, "1e3" as 1000.0: the value as the program read it
        number = float(value)
        shown += [repr(number), f"{number:g}"] + ([str(int(number))] if number.is_integer() else [])
    except (ValueError, OverflowError):
        pass
    return any(s and s in err for s in shown) or not value.strip()


# text a user might type: printable, unicode, control characters, numbers of every kind
values = st.one_of(
    st.text(max_size=12),
    st.integers(-10**12, 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e309", "0", "-1", "1.5", "true", "None", "", " ",
                     "0x10", "1_000", "٣", "bf16", "fused", "cosine", "\x00", "1,2", "--x"]),
)
FIELDS = [f"{part}.{f.name}" for part in ("loader", "step", "optim", "schedule")
          for f in dataclasses.fields(getattr(Recipe(name="x"), part))] + ["cpu_threads",
                                                                             "loss_sync",
                                                                             "thread_policy"]
keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=16),
                 st.sampled_from(["loader", "optim.", ".lr", "optim.lr.x", "name", "loader.name",
                                  "__class__.lr", "step.__dict__", "schedule.name"]))


@FUZZ
@given(key=keys, value=values)
@example(key="loader.prefetch_factor", value="")  # was: TypeError comparing str and int
@example(key="loader.batch_size", value="0")  # was: ZeroDivisionError in the schedule check
@example(key="optim.lr", value="inf")  # was: accepted
@example(key="cpu_threads", value="x")
def test_set_assignments(no_runs, capsys, key, value):
    argv = ["bench", "mnist", "--recipes", "seed-baseline", "--epochs", "1",
            f"--set={key}={value}"]  # one token: a key may start with "-"
    code, err = run_cli(argv, capsys)
    if code == "ran":
        return  # a valid assignment: accepted, and the recipe's checks passed
    assert code == 2, err
    assert "Traceback" not in err and "error" in err
    field = key.strip().split(".")[-1]  # a conflict between settings names the field
    assert named(key.strip(), err) or named(field, err) or named(value, err), err


recipe_lists = st.one_of(
    st.text(max_size=30),
    st.lists(st.one_of(st.sampled_from(["seed-baseline", "fast", "tensorized", "device",
                                        "workers", "FAST", "fast ", "", "seed_baseline"]),
                       st.text(max_size=10)), min_size=1, max_size=4).map(",".join),
)


@FUZZ
@given(names=recipe_lists)
def test_recipe_names(no_runs, capsys, names):
    code, err = run_cli(["bench", "mnist", "--epochs", "1", f"--recipes={names}"], capsys)
    if code == "ran":
        return
    assert code == 2, err
    assert "Traceback" not in err
    bad = [n for n in names.split(",") if n.strip()]
    assert not bad or any(named(n.strip(), err) for n in bad) or "recipe" in err, err


BENCH_NUMBERS = ["--epochs", "--seed", "--repeats", "--target", "--eval-every",
                 "--checkpoint-every", "--nproc", "--dist-timeout", "--context", "--max-bytes"]


@FUZZ
@given(flag=st.sampled_from(BENCH_NUMBERS), value=values)
@example(flag="--max-bytes", value="1024")  # was: a message that did not name --max-bytes
def test_bench_numeric_flags(no_runs, capsys, flag, value):
    extra = ["--checkpoint", "ck"] if flag == "--checkpoint-every" else []
    workload = "char-gpt" if flag in ("--context", "--max-bytes") else "mnist"
    code, err = run_cli(["bench", workload, "--recipes", "seed-baseline" if workload == "mnist"
                         else "baseline", "--epochs", "1", *extra, f"{flag}={value}"], capsys)
    assert_number_outcome(code, err, flag, value)


@FUZZ
@given(flag=st.sampled_from(["--steps", "--warmup", "--seconds", "--nproc",
                             "--first-step-timeout"]), value=values)
@example(flag="--seconds", value="inf")  # was: accepted
def test_diagnose_numeric_flags(no_runs, capsys, flag, value):
    code, err = run_cli(["diagnose", f"{flag}={value}", str(no_runs)], capsys)
    assert_number_outcome(code, err, None, value)


@FUZZ
@given(what=st.sampled_from(["loader", "batch-size"]), value=values,
       flag=st.sampled_from(["--budget-s", "--device", "--batch-size", "--max-memory-fraction",
                             "--keep-effective"]))
def test_tune_numeric_flags(no_runs, capsys, what, flag, value):
    if (flag == "--batch-size") != (what == "loader") and flag in ("--batch-size",
                                                                   "--max-memory-fraction",
                                                                   "--keep-effective"):
        flag = "--budget-s"  # each kind's own flags
    code, err = run_cli(["tune", what, "--workload", "mnist", f"{flag}={value}"], capsys)
    if code == "ran" and flag == "--device":
        assert value in ("auto", "cpu"), f"--device {value!r} was accepted"
        return
    assert_number_outcome(code, err, flag, value)


def assert_number_outcome(code: int | str, err: str, flag: str | None, value: str) -> None:
    """Accepted: a finite number (nan, inf and friends must be refused). Refused: exit 2, no
    traceback, the message names the value (or, for a conflict with another setting, the flag)."""
    if code == "ran":
        number = float(value.replace("_", ""))
        assert math.isfinite(number), f"{value!r} was accepted"
        return
    assert code == 2, err
    assert "Traceback" not in err
    assert named(value, err) or (flag is not None and flag in err), err
