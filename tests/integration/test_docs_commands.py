"""Every `looptune ...` command the docs/ pages show runs (issue 34), not only parses: a page's
commands in the order it shows them (a later one may read what an earlier one wrote: `pack
--verify train.pack` after `pack ... train.pack`), in a fresh folder holding what their
placeholders name (doc_commands.newcomer_folder), each exiting 0 and printing the words its kind
promises (doc_commands.PROMISES).

What is changed, and only this: sizes are scaled down (SCALE: `--samples 12000` runs 800
files, `--repeats 3` one repeat, `bench mnist` one epoch, `pack --bench` batches of 64), and a
folder name a page uses for a folder it did not write stands for one it did (ALIASES). A command
asking for `--device cuda` on a machine without CUDA must refuse with exit 2 and the stated
reason. The flags, sub-commands and choices run as shown, so a renamed flag or a changed output
word fails here. The README's commands are run by test_readme_quickstart.py and .ci/readme-setup.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from doc_commands import PAGES, ROOT, commands, newcomer_folder, promise

# flag: the largest value run (a page's larger value runs this one)
SCALE = {"--samples": 800, "--repeats": 1, "--epochs": 1, "--budget-s": 10, "--seconds": 5,
         "--steps": 20}
# names a page gives a folder it did not write in its own commands: one it did, or the fixture's
ALIASES = {"train-12000": "jf/train"}

# a size the command leaves to its default, given smaller (bench mnist: 5 epochs; pack --bench:
# batches of 256, 3 per stream share, more than the 800 files a scaled page writes)
SMALLER_DEFAULTS = {("bench", "mnist"): ("--epochs", "1"), ("pack", "--bench"): ("--batch-size", "64")}


def scaled(argv: list[str]) -> list[str]:
    """``argv`` with its sizes capped by SCALE, ALIASES applied, and SMALLER_DEFAULTS added
    where the command leaves the size to its default."""
    out = []
    for i, word in enumerate(argv):
        if i and argv[i - 1] in SCALE and word.isdigit():
            word = str(min(int(word), SCALE[argv[i - 1]]))
        out.append(ALIASES.get(word, word))
    for first, (flag, value) in SMALLER_DEFAULTS.items():
        if tuple(out[:len(first)]) == first and flag not in out:
            out += [flag, value]
    return out


def test_scaling_changes_sizes_only():
    assert scaled(["data", "images", "--out", "jf/train", "--samples", "12000"]) == [
        "data", "images", "--out", "jf/train", "--samples", "800"]
    assert scaled(["bench", "mnist", "--repeats", "3", "--seed", "1"]) == [
        "bench", "mnist", "--repeats", "1", "--seed", "1", "--epochs", "1"]
    assert scaled(["pack", "--images", "train-12000", "--size", "48", "p.pack"]) == [
        "pack", "--images", "jf/train", "--size", "48", "p.pack"]
    assert scaled(["tune", "loader", "--budget-s", "5"]) == ["tune", "loader", "--budget-s", "5"]


def _wants_cuda(argv: list[str]) -> bool:
    return any(a == "--device" and b == "cuda" for a, b in zip(argv, argv[1:]))


DOC_PAGES = [page for page in PAGES if page.name != "README.md" and any(commands(page))]


def test_the_docs_pages_show_commands():
    assert len(DOC_PAGES) >= 8
    assert sum(1 for page in DOC_PAGES for _ in commands(page)) >= 35


@pytest.mark.integration
@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_every_command_of_the_page_runs(page, tmp_path, mnist_dir):
    work = newcomer_folder(tmp_path, mnist_dir)
    env = {**os.environ, "LOOPTUNE_DATA": str(mnist_dir), "PYTHONPATH": str(work)}
    for line, argv in commands(page):
        run = scaled(argv)
        shown = f"{page.relative_to(ROOT)}:{line}: `looptune {' '.join(argv)}`"
        proc = subprocess.run([sys.executable, "-m", "looptune", *run], cwd=work, env=env,
                              capture_output=True, text=True, timeout=300)
        output = proc.stdout + proc.stderr
        if _wants_cuda(run) and not torch.cuda.is_available():  # the CPU user's answer instead
            assert proc.returncode == 2 and "no CUDA device is available" in output, (
                f"{shown} on a machine without CUDA: exit {proc.returncode}, not the stated "
                f"refusal:\n{output[-2000:]}")
            continue
        assert proc.returncode == 0, f"{shown} exited {proc.returncode}:\n{output[-3000:]}"
        words = promise(run)
        assert words is not None, f"{shown}: no promise: add one to doc_commands.PROMISES"
        assert re.search(words, output), f"{shown} did not print {words!r}:\n{output[-2000:]}"
