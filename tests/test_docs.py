"""The documentation cannot drift from the code (issue 34): every `looptune ...` command shown in
README.md and docs/ parses with the CLI's own parser (flag names, choices, sub-commands), every
Python block compiles, every relative link resolves, the README stays short, and the MkDocs site
builds with --strict (a broken link or a missing page fails)."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from looptune.cli import diagnose as diagnose_cmd
from looptune.cli.main import build_parser

from doc_commands import FENCE, PAGES, ROOT, blocks, commands

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _all_commands():
    return [(page, line, argv) for page in PAGES for line, argv in commands(page)]


def _exact(parser):
    """The CLI's parser, every sub-parser refusing abbreviated flags (``--epoch`` for
    ``--epochs``): a page must show the flag as it is."""
    import argparse

    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _exact(sub)
    return parser


def test_the_pages_show_commands_at_all():
    found = _all_commands()
    assert len(found) > 40
    assert any(argv[:2] == ["bench", "mnist"] for page, _, argv in found if page.name == "README.md")


@pytest.mark.parametrize("page, line, argv", _all_commands(),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v)[:40])
def test_every_command_shown_parses_with_the_cli(page, line, argv, capsys):
    parser = _exact(build_parser())
    if argv[:1] == ["diagnose"]:
        argv = diagnose_cmd.split_argv(argv)  # as main() does: the script's options are its own
    try:
        parser.parse_args(argv)
    except SystemExit as exit_:
        err = capsys.readouterr().err.strip().splitlines()
        pytest.fail(f"{page.relative_to(ROOT)}:{line}: `looptune {' '.join(argv)}` does not parse "
                    f"(exit {exit_.code}): {err[-1] if err else ''}")


def test_the_parser_check_catches_a_drifted_flag(capsys):
    with pytest.raises(SystemExit):  # what the test above relies on
        _exact(build_parser()).parse_args(["bench", "mnist", "--epoch", "1"])
    with pytest.raises(SystemExit):
        _exact(build_parser()).parse_args(["pack", "--format", "parquet", "x"])
    _exact(build_parser()).parse_args(["bench", "mnist", "--epochs", "1"])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_compile(page):
    for line, block in blocks(page, ("python",)):
        try:
            compile(block, f"{page.name}:{line}", "exec")
        except SyntaxError as err:
            pytest.fail(f"{page.relative_to(ROOT)}:{line}: a Python block does not compile: {err}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)}: link {target!r} points at nothing"
        if page.parent == ROOT / "docs" or ROOT / "docs" in page.parents:
            assert ROOT / "docs" in path.parents, (
                f"{page.relative_to(ROOT)}: link {target!r} leaves docs/ (the site cannot "
                "follow it): name the file as `code` instead")


def test_the_readme_is_short_and_names_no_machine_of_ours():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "../shared" not in text  # a path that exists only on our machines
    for dated in ("this session", "evening", "previous machine", "today"):
        assert dated not in text, dated
    head = "\n".join(text.splitlines()[:60])
    assert "pip install" in text and "## Set up" in text and "## Results" in head


def test_ci_installs_with_the_readme_set_up_commands():
    """.ci/run runs the README's set-up block as written (.ci/readme-setup), in its fresh venv:
    the install line and the main job are the ones a newcomer copies."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/readme-setup" in ci
    assert "pip install" not in ci.split("bash .ci/readme-setup")[0]  # nothing installed first
    proc = subprocess.run(["awk", '/^## Set up/{s=1; next} s && /^```bash/{b=1; next} '
                           'b && /^```/{exit} b', str(ROOT / "README.md")],
                          capture_output=True, text=True, check=True)  # .ci/readme-setup's awk
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines[0].startswith("pip install torch==2.13.0 -e '.[") and "test" in lines[0]
    assert lines[1].split("#")[0].split() == ["looptune", "bench", "mnist"]


def test_the_site_builds_strict(tmp_path):
    if shutil.which("mkdocs") is None and not _has_module("mkdocs"):
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; CI installs it)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                           str(tmp_path / "site"), "-f", str(ROOT / "mkdocs.yml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "diagnose" / "index.html").is_file()


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_the_results_tables_are_rendered_from_their_records():
    """docs/results.md shows each bench record of benchmarks/results/ as
    tools/results_tables.py renders it: a table edited by hand, or a record replaced
    without its table, fails."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import results_tables
    finally:
        sys.path.pop(0)
    page = (ROOT / "docs" / "results.md").read_text()
    records = results_tables.bench_records()
    assert len(records) >= 2
    for record in records:
        table = results_tables.table(record)
        assert table.count("\n") >= 3 and table in page, (
            f"docs/results.md lacks the table of {record.name}: paste the output of "
            f"python tools/results_tables.py {record.relative_to(ROOT)}")


def test_every_built_in_recipe_is_in_the_recipes_page():
    from looptune.presets import REGISTRIES

    page = (ROOT / "docs" / "recipes.md").read_text()
    for workload, (recipes, _) in REGISTRIES.items():
        assert f"`{workload}`" in page or workload == "mnist-mlp", workload
        for name in recipes:
            assert f"`{name}`" in page, f"docs/recipes.md does not describe {workload}'s {name}"


BENCH_COMMAND = re.compile(r"python ((?:benchmarks|tools)/[a-z][a-z0-9_]*\.py)([^`|\n#]*)")


def _script_commands():
    """(page, script, argv) of every `python benchmarks/X.py ...` or `python tools/X.py ...`
    the pages show, in code blocks or inline (`[--flag value ...]`: an optional part, kept)."""
    out = []
    for page in PAGES:
        for script, rest in BENCH_COMMAND.findall(page.read_text()):
            argv = [w for w in shlex.split(rest.replace("[", " ").replace("]", " ")) if w != "..."]
            out.append((page, script, argv))
    return out


class _Parsed(Exception):
    pass


def test_the_pages_show_benchmark_commands():
    scripts = {script for _, script, _ in _script_commands()}
    assert len(scripts) >= 15 and "benchmarks/run_goals.py" in scripts


@pytest.mark.parametrize("page, script, argv", _script_commands(),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v)[:40])
def test_every_benchmark_command_shown_parses_with_its_script(page, script, argv, monkeypatch,
                                                              capsys):
    """The script's own parser takes the flags as shown (no abbreviations); nothing runs: the
    parse is stopped where it returns. The benchmarks' work is run by their --smoke tests."""
    import argparse
    import runpy

    path = ROOT / script
    assert path.is_file(), f"{page.relative_to(ROOT)} shows {script}, which does not exist"
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        self.allow_abbrev = False
        raise _Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/X.py` has it
    module = runpy.run_path(str(path), run_name="looptune_docs_check")
    try:
        module["main"](*([argv] if module["main"].__code__.co_argcount else []))
    except _Parsed:
        return
    except SystemExit as exit_:
        err = capsys.readouterr().err.strip().splitlines()
        pytest.fail(f"{page.relative_to(ROOT)}: `python {script} {' '.join(argv)}` does not "
                    f"parse (exit {exit_.code}): {err[-1] if err else ''}")
    pytest.fail(f"{script}'s main() returned without parsing its arguments")


def _resolve(node, names: dict):
    """The looptune object an expression names (``Recipe``, ``looptune.train``,
    ``looptune.integrations.lightning``), importing submodules as Python would; None when the
    expression is not looptune's."""
    import importlib

    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return None
    obj, path = names[node.id], getattr(names[node.id], "__name__", "")
    for attr in reversed(chain):
        if not hasattr(obj, attr) and isinstance(obj, types.ModuleType):
            importlib.import_module(f"{path}.{attr}")  # a submodule: import it
        obj = getattr(obj, attr)
        path = f"{path}.{attr}"
    return obj


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_blocks_name_what_looptune_has(page):
    """Every looptune name a Python block imports or uses exists, and every keyword it passes to
    a looptune callable is one that callable takes: an API renamed under the page fails here."""
    import importlib
    import inspect

    import looptune

    for line, block in blocks(page, ("python",)):
        names: dict = {"looptune": looptune}
        tree = ast.parse(block)
        where = f"{page.relative_to(ROOT)}:{line}"
        try:
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("looptune"):
                    module = importlib.import_module(node.module)
                    for alias in node.names:
                        assert hasattr(module, alias.name), (
                            f"{where}: `from {node.module} import {alias.name}`: no such name")
                        names[alias.asname or alias.name] = getattr(module, alias.name)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                target = _resolve(node.func, names)
                if target is None or not callable(target):
                    continue
                params = inspect.signature(target).parameters
                if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                    continue
                for kw in node.keywords:
                    assert kw.arg is None or kw.arg in params, (
                        f"{where}: `{ast.unparse(node.func)}(..., {kw.arg}=...)`: it takes "
                        f"no {kw.arg!r} (it takes {', '.join(params)})")
        except ModuleNotFoundError as err:
            if (err.name or "").startswith("looptune"):
                raise
            pytest.skip(f"{where} needs {err.name}, not installed here (CI installs the extras)")
