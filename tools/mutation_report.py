"""The surviving mutants of the last `make mutation` run, sorted into what they change.

A mutant that only edits the text of a string (a reason, a label, a message) cannot flip a
verdict, a remedy's rank or a tuner's choice; it is counted as "text" per function. Every other
survivor is printed with its diff: each is either killed by a new test, or shown to change no
decision (an equivalent mutant) in docs/testing.md.

    python -m mutmut run $(make -s mutants)      # see the Makefile
    python tools/mutation_report.py [--json FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tokenize
from collections import Counter

FUNCTION = re.compile(r"^(.*)__mutmut_\d+$")


def _tokens(code: str) -> tuple[list[str], list[str]] | None:
    """(the code's tokens with every string literal blanked, the string literals); None: not
    whole statements."""
    out, strings = [], []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.STRING:
                out.append("<str>")
                strings.append(tok.string)
            elif tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                  tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                out.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return out, strings


def text_only(diff: str) -> bool:
    """True when the mutant's changed lines differ only inside string literals that are prose
    (they hold a space: a reason, a message). A changed word-like string ("overhead", "ok", a
    dict key) may be a value the code compares or returns: it counts as code."""
    lines = diff.splitlines()
    old = "\n".join(ln[1:] for ln in lines if ln.startswith("-") and not ln.startswith("---"))
    new = "\n".join(ln[1:] for ln in lines if ln.startswith("+") and not ln.startswith("+++"))
    a, b = _tokens(old.strip()), _tokens(new.strip())
    if a is None or b is None or a[0] != b[0]:
        return False
    changed = [x for x, y in zip(a[1], b[1]) if x != y]
    return all(" " in x for x in changed)


def survivors() -> list[tuple[str, str]]:
    # mutmut 3.8.1 internals (pinned in the `mutation` extra): the results and one mutant's diff
    from mutmut.__main__ import SourceFileMutationData, status_by_exit_code, walk_mutatable_files
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    out = []
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, code in data.exit_code_by_key.items():
            if status_by_exit_code[code] == "survived":
                out.append((name, get_diff_for_mutant(name, path=data.path)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="write {function: {text, logic: [diffs]}} here")
    args = p.parse_args(argv)
    found = survivors()
    text: Counter[str] = Counter()
    logic: dict[str, list[str]] = {}
    for name, diff in found:
        function = FUNCTION.match(name).group(1)
        if text_only(diff):
            text[function] += 1
        else:
            logic.setdefault(function, []).append(f"# {name}\n{diff}")
    for function, diffs in sorted(logic.items()):
        print(f"\n## {function}: {len(diffs)} survivor(s) that change code")
        for d in diffs:
            print(d)
    print(f"\n{len(found)} survivors: {sum(text.values())} change only a string's text "
          f"({len(text)} functions), {sum(map(len, logic.values()))} change code "
          f"({len(logic)} functions)")
    if args.json:
        record = {f: {"text": text.get(f, 0), "logic": logic.get(f, [])}
                  for f in sorted(set(text) | set(logic))}
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
