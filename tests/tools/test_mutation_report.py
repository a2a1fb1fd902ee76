"""tools/mutation_report.py sorts surviving mutants: a change of a string's words only is "text";
anything else (an operator, a number, a removed argument, a string turned into None) is code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "mutation_report.py"
spec = importlib.util.spec_from_file_location("mutation_report", TOOL)
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def _diff(old: str, new: str) -> str:
    return f"--- a.py\n+++ a.py\n@@ -1 +1 @@\n-{old}\n+{new}"


def test_a_change_inside_a_string_is_text():
    assert report.text_only(_diff('    reason = f"compute is {c:.1%}"', '    reason = f"XXcompute is {c:.1%}XX"'))
    assert report.text_only(_diff('    msg = "the batch is small"', '    msg = "THE BATCH IS SMALL"'))


def test_a_change_of_code_is_not_text():
    assert not report.text_only(_diff("    ok = gain >= THRESHOLD", "    ok = gain > THRESHOLD"))
    assert not report.text_only(_diff("    k = k * 2", "    k = k * 3"))
    assert not report.text_only(_diff('    name = "overhead"', "    name = None"))
    assert not report.text_only(_diff('    f(x, "why")', "    f(x, )"))


def test_a_changed_word_like_string_may_be_a_value_and_counts_as_code():
    assert not report.text_only(_diff('    name = "overhead"', '    name = "XXoverheadXX"'))
    assert not report.text_only(_diff('    if t["status"] == "ok":', '    if t["STATUS"] == "ok":'))
