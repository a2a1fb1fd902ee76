"""The README's quickstart commands run as a newcomer runs them (issue 34): every `looptune ...`
line of its Quickstart bash blocks, unchanged, in a folder holding what their placeholders name
(doc_commands.newcomer_folder), with MNIST from $LOOPTUNE_DATA. Each must exit 0 and print
what it promises."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from doc_commands import ROOT, newcomer_folder, promise


def _quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quickstart"):text.index("\n## ", text.index("## Quickstart") + 5)]
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command:
                out += [c.strip() for c in command.split("&&")]
    return out


def test_the_quickstart_has_commands():
    commands = _quickstart_commands()
    assert len(commands) >= 10 and all(c.startswith("looptune ") for c in commands)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, mnist_dir):
    return newcomer_folder(tmp_path_factory.mktemp("newcomer"), mnist_dir)


@pytest.mark.integration
@pytest.mark.parametrize("command", _quickstart_commands())
def test_every_quickstart_command_runs(workdir, command, mnist_dir):
    argv = shlex.split(command)
    env = {**os.environ, "LOOPTUNE_DATA": str(mnist_dir), "PYTHONPATH": str(workdir)}
    proc = subprocess.run([sys.executable, "-m", "looptune", *argv[1:]], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{output[-3000:]}"
    words = promise(argv[1:])
    assert words is not None, f"no promise for `{command}`: add one to doc_commands.PROMISES"
    assert re.search(words, output), f"`{command}` did not print {words!r}:\n{output[-2000:]}"
