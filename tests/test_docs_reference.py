"""The documentation's references hold what the code holds, and the README what CI runs.

- ``docs/reference/{commands,config,uploads}.md`` are what ``scripts/gen_reference.py``
  writes from the code now; and, walked here on their own, every command and flag of the
  parser and every key of the config models (and of every method's ``[method]`` table) is
  in its page;
- ``docs/reference/wire.md`` names every message type, topic kind and array dtype of the
  wire, and its worked examples are the bytes the codec writes;
- the README opens with the two commands, and ``.ci/run`` runs its test command;
- no page names a module path that does not exist, and no module speaks of an issue.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from benchmarks.registry import BY_NAME
from benchmarks.summarize import places
from mqttfl.commands.main import build_parser
from mqttfl.config import RunConfig
from tests.helpers import REPO

DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"
README = REPO / "README.md"
RUN_COMMAND = "bash scripts/setup.sh && .venv/bin/mqttfl run configs/fedapa-csi.toml"
TEST_COMMAND = "bash scripts/setup.sh && .venv/bin/python -m pytest"


def _section(page: str, heading: str) -> str:
    """The text of ``page`` from the heading line that starts with ``heading`` to the next
    heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = page.index(f"\n{heading}")
    rest = page[start + 1 :]
    stops = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.M)][1:]
    return rest[: stops[0]] if stops else rest


# --- generated pages ------------------------------------------------------------------------
def test_the_generated_references_are_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_reference.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr


def _commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ("mqttfl",)
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = []
            for name, child in action.choices.items():
                found += _commands(child, (*words, name))
            return found
    return [(words, parser)]


def test_every_command_and_flag_is_in_the_commands_page() -> None:
    page = (REFERENCE / "commands.md").read_text()
    commands = _commands(build_parser())
    assert len(commands) >= 15
    for words, parser in commands:
        section = _section(page, f"## {' '.join(words)} ")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert re.search(rf"(`|, ){re.escape(flag)}[ `,]", section), (words, flag)
            if not action.option_strings:
                name = str(action.metavar or action.dest.upper())
                assert f"`{name}`" in section, (words, name)


def _keys() -> dict[str, list[str]]:
    """{"Top level": [run_id, ...], "[federation]": [num_clients, ...], ...}"""
    tables: dict[str, list[str]] = {"## Top level": []}
    for name, info in RunConfig.model_fields.items():
        annotation = info.annotation
        if name == "method_params":
            continue
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            tables[f"## [{name}]"] = list(annotation.model_fields)
        else:
            tables["## Top level"].append(name)
    return tables


def test_every_config_key_is_in_the_config_page() -> None:
    page = (REFERENCE / "config.md").read_text()
    tables = _keys()
    assert sum(len(keys) for keys in tables.values()) > 50
    for heading, keys in tables.items():
        section = _section(page, heading)
        for key in keys:
            assert f"| `{key}` |" in section, (heading, key)


def test_every_method_and_its_keys_are_in_the_config_page() -> None:
    from mqttfl.algorithms import algorithm_names, get_algorithm

    page = (REFERENCE / "config.md").read_text()
    for name in algorithm_names():
        section = _section(page, f"### {name}")
        for key in get_algorithm(name).params.model_fields:
            assert f"| `{key}` |" in section, (name, key)


def test_every_method_has_its_upload_schema_page_section() -> None:
    from mqttfl.algorithms import algorithm_names

    page = (REFERENCE / "uploads.md").read_text()
    for name in algorithm_names():
        assert f"\n## {name}\n" in page, name


def test_the_meanings_file_names_only_keys_that_exist() -> None:
    from mqttfl.algorithms import algorithm_names, get_algorithm

    tree = tomllib.loads((REPO / "scripts" / "config_meanings.toml").read_text())
    tables = _keys()
    top = set(tables.pop("## Top level"))
    assert set(tree.pop("_top")) <= top
    intros = tree.pop("_tables")
    methods = tree.pop("method")
    for table, keys in tree.items():
        assert set(keys) <= set(tables[f"## [{table}]"]), table
    assert set(intros) <= {heading[4:-1] for heading in tables}
    every = {k for n in algorithm_names() for k in get_algorithm(n).params.model_fields}
    for key, value in methods.items():
        if isinstance(value, dict):
            assert key in algorithm_names(), key
            assert set(value) <= set(get_algorithm(key).params.model_fields), key
        else:
            assert key in every, key


# --- the wire -------------------------------------------------------------------------------
def test_the_wire_page_names_every_message_type_topic_and_dtype() -> None:
    from mqttfl.wire import codec, topics
    from mqttfl.wire.chunks import HEADER_BYTES

    page = (REFERENCE / "wire.md").read_text()
    for kind in codec.MESSAGE_TYPES:
        assert f"`{kind}`" in page, kind
    for dtype in codec.ALLOWED_DTYPES:
        assert dtype in page, dtype
    table = _section(page, "## Topics")
    for cls in topics.TopicInfo.__args__:
        assert f"/{cls.kind}" in table, cls.kind
    assert f"**extension of type {codec.ARRAY_EXT}**" in page
    assert f"| `v` | integer | the schema version, `{codec.SCHEMA_VERSION}` |" in page
    assert f"a {HEADER_BYTES}-byte header" in page


def _example(page: str, name: str) -> bytes:
    block = page.split(f"<!-- wire-example: {name} -->", 1)[1].split("```text\n", 1)[1]
    return bytes.fromhex(block.split("```", 1)[0].replace("\n", " "))


def test_the_wire_page_examples_are_what_the_codec_writes() -> None:
    from mqttfl.wire.codec import Message, encode
    from mqttfl.wire.control import Ack

    page = (REFERENCE / "wire.md").read_text()
    assert _example(page, "ack") == Ack(3, "7", announcement=2).encode("demo")
    body = {"classes": np.array([0, 2], np.int64), "prototypes": np.zeros((2, 2), np.float32)}
    assert _example(page, "upload") == encode(Message("upload", "demo", 3, "7", body))


# --- the README and CI ----------------------------------------------------------------------
def test_the_readme_opens_with_the_two_commands_and_is_short() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    commands = [
        line.strip() for line in text.splitlines() if line.startswith("    ") and line.strip()
    ][:2]
    assert commands == [RUN_COMMAND, TEST_COMMAND]
    assert not re.search(r"issue \d", text, re.I)


def test_ci_runs_the_readmes_test_command_and_builds_the_docs() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    setup, _, test = TEST_COMMAND.partition(" && ")
    assert setup in ci
    assert test in ci
    assert ci.index(setup) < ci.index(test)
    assert "mkdocs build --strict" in ci


def test_the_readmes_links_lead_to_files() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README.read_text()):
        if "://" not in target:
            assert (REPO / target).exists(), target


@pytest.mark.parametrize("root", ["docs", "README.md"])
def test_the_docs_name_only_module_paths_that_exist(root: str) -> None:
    paths = [REPO / root] if root.endswith(".md") else sorted((REPO / root).rglob("*.md"))
    for path in paths:
        for name in set(
            re.findall(r"\b(?:mqttfl|tests|benchmarks|scripts)/[\w/]+\.py\b", path.read_text())
        ):
            if name == "mqttfl/algorithms/fedprox.py":  # the tutorial writes it
                continue
            assert (REPO / name).exists(), f"{path.relative_to(REPO)} names {name}"


def test_no_module_doc_or_config_speaks_of_an_issue() -> None:
    """The code, the docs, the configs and the benchmarks speak of the code, not of its
    history (CHANGELOG.md keeps that)."""
    sources = [
        *(REPO / "mqttfl").rglob("*.py"),
        *(REPO / "benchmarks").glob("*.py"),
        *(REPO / "docs").rglob("*.md"),
        *(REPO / "configs").glob("*.toml"),
    ]
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted(sources)
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"issue \d", line, re.I)
    ]
    assert not found, found


def test_every_generated_benchmark_section_has_a_benchmark() -> None:
    found = places()
    assert len(found) >= 9
    for name in found:
        assert name in BY_NAME, name
        assert BY_NAME[name].section is not None, name
