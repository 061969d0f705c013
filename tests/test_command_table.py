"""A process imports the module of the command it runs, and no other command's: the
command table builds one command's parser when the first word names it, and the whole
command line for ``mqttfl --help`` and for a word that names no command."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys

import pytest

from mqttfl.commands.main import COMMANDS, build_parser, named_command
from tests.helpers import REPO, mqttfl

LOADED = """
import sys
{code}
print(" ".join(sorted(m for m in sys.modules if m.startswith("mqttfl.commands."))))
"""


def _command_modules(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED.format(code=code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


@pytest.mark.parametrize("command", ["client", "logs", "sense"])
def test_a_command_imports_its_own_module_and_no_other_commands(command: str) -> None:
    ran = _command_modules(
        "import contextlib, io\n"
        "from mqttfl.commands.main import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main([{command!r}, '--help'])"
    )
    alone = _command_modules(f"import mqttfl.commands.main, {COMMANDS[command][0]}")
    assert COMMANDS[command][0] in ran
    assert ran == alone
    others = {module for name, (module, _) in COMMANDS.items() if name != command}
    assert others - alone, "the command's own module imports every other command"
    assert not (others - alone) & ran


def test_the_table_holds_every_command_module() -> None:
    """Every ``add_*`` function of the commands package is in the table, under the name
    it registers."""
    found: dict[str, str] = {}
    for path in sorted((REPO / "mqttfl" / "commands").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("add_"):
                continue
            if node.name.endswith(("_command", "_commands")):
                found[node.name] = f"mqttfl.commands.{path.stem}"
    assert sorted(found.items()) == sorted((adder, module) for module, adder in COMMANDS.values())
    for name in COMMANDS:
        parser = build_parser(name)
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        assert list(sub._name_parser_map) == [name]


def test_help_and_an_unknown_word_see_every_command() -> None:
    assert named_command(["--help"]) is None
    assert named_command(["nosuch"]) is None
    assert named_command([]) is None
    listed = mqttfl("--help")
    assert listed.returncode == 0
    for name in COMMANDS:
        assert name in listed.stdout
    unknown = mqttfl("nosuch")
    assert unknown.returncode == 2
    assert "invalid choice: 'nosuch'" in unknown.stderr
    assert all(name in unknown.stderr for name in COMMANDS)
