"""The blocks of a guide (docs/tutorials/, docs/how-to/) that a reader types, and how a
test runs them.

The convention, which docs/index.md states for readers too:

- A ```` ```console ```` block is typed in a shell. Its lines that start with ``$ `` are
  commands (a line ending in ``\\`` continues on the next); the other lines are output,
  shown as it was printed. Every console block is run by ``tests/test_docs_guides.py``
  in a fresh folder, one bash per block, in the page's order, with ``set -e``; each block
  starts in the page's folder (a new terminal), with the checkout's ``configs/`` and
  ``deploy/`` beside it and the venv's ``mqttfl`` on the PATH.
- A fenced block with ``title="PATH"`` (```` ```toml title="my.toml" ````) is a file the
  reader writes: the test writes it to PATH when it reaches it. A ```` ```diff ```` block
  with a title is an edit of that file: its ``-`` and context lines must occur in it once,
  and become its ``+`` and context lines.
- An HTML comment right before a block tells the test how to run it
  (``<!-- test: ... -->``, words as in a shell):

  - ``skip="why"``: not run (it needs what a test machine lacks: root's systemd, a
    second machine, a download);
  - ``background``: started and left running; ``name=NAME`` names it for ``after``,
    and ``ready="text"`` waits until its output holds the text;
  - ``after=NAME``: first wait until background block NAME has exited, and check it
    exited 0; ``when="NAME:text"``: first wait until its output holds the text;
  - ``exit=N``: the block must exit with N (a command shown failing);
  - ``expect="text"``: the block's output must hold the text;
  - ``sub="OLD => NEW"``: replace OLD by NEW in this block before running it (a smaller
    job where the real one is long).

- ``<!-- test-page: ... -->`` anywhere on the page sets, for all its blocks:
  ``sub="OLD => NEW"``, ``broker`` (a Mosquitto the test starts; ``{broker}`` is its URL
  in a substitution), ``checkout`` (the page's folder is a copy of the checkout, with
  ``PYTHONPATH`` pointing at it: a page that edits mqttfl's code), ``shared=PATH`` (the
  page reads real recordings under ../shared/data; ``{shared}`` is that folder) and
  ``timeout=S``. In a substitution, ``{port}`` and ``{port2}`` are free loopback ports.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

GUIDES = ("tutorials", "how-to")
#: shell fences a guide may not use: a typed block is ```console, and so it is run
SHELL_FENCES = frozenset({"bash", "sh", "shell", "zsh", "shell-session"})
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^<!--\s*(test|test-page):(?P<body>.*?)-->\s*$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass
class Block:
    """One fenced block of a guide."""

    page: Path
    line: int  # 1-based, the opening fence
    lang: str
    title: str | None
    text: str
    options: dict[str, list[str]] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"

    def option(self, name: str) -> str | None:
        values = self.options.get(name)
        return values[-1] if values else None

    def commands(self) -> list[str]:
        """The lines after ``$ `` (continuations joined as the shell would see them)."""
        found: list[str] = []
        current: list[str] | None = None
        for raw in self.text.splitlines():
            if current is not None:
                current.append(raw)
                if not raw.endswith("\\"):
                    found.append("\n".join(current))
                    current = None
                continue
            if raw.startswith("$ "):
                command = raw[2:]
                if command.endswith("\\"):
                    current = [command]
                else:
                    found.append(command)
        if current is not None:
            found.append("\n".join(current))
        return found


@dataclass
class Page:
    path: Path
    blocks: list[Block]
    options: dict[str, list[str]]

    def option(self, name: str) -> str | None:
        values = self.options.get(name)
        return values[-1] if values else None


def parse_options(body: str) -> dict[str, list[str]]:
    """``background name=coord sub="a => b"`` -> {"background": [""], "name": ["coord"], ...}."""
    options: dict[str, list[str]] = {}
    for word in shlex.split(body):
        key, _, value = word.partition("=")
        options.setdefault(key, []).append(value)
    return options


def read_page(path: Path) -> Page:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    page_options: dict[str, list[str]] = {}
    pending: dict[str, list[str]] = {}
    index = 0
    while index < len(lines):
        line = lines[index]
        directive = _DIRECTIVE.match(line.strip())
        if directive:
            options = parse_options(directive.group("body"))
            target = page_options if directive.group(1) == "test-page" else pending
            for key, values in options.items():
                target.setdefault(key, []).extend(values)
            index += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip():
                pending = {}  # a directive applies to the block right after it
            index += 1
            continue
        info = fence.group("info").strip()
        lang = info.split()[0] if info else ""
        title = _TITLE.search(info)
        indent = len(fence.group("indent"))
        body: list[str] = []
        close = index + 1
        while close < len(lines) and lines[close].strip() != fence.group("fence"):
            body.append(lines[close][indent:])
            close += 1
        blocks.append(
            Block(
                page=path,
                line=index + 1,
                lang=lang,
                title=title.group("title") if title else None,
                text="\n".join(body) + "\n",
                options=pending,
            )
        )
        pending = {}
        index = close + 1
    return Page(path, blocks, page_options)


def guide_pages(docs: Path) -> list[Path]:
    return sorted(p for folder in GUIDES for p in (docs / folder).glob("*.md"))


def substitutions(page: Page, block: Block) -> list[tuple[str, str]]:
    pairs = []
    for text in [*page.options.get("sub", []), *block.options.get("sub", [])]:
        old, sep, new = text.partition(" => ")
        if not sep:
            raise ValueError(f"{block.where}: a substitution is 'OLD => NEW', got {text!r}")
        pairs.append((old, new))
    return pairs


def apply_diff(original: str, diff: str, where: str) -> str:
    """``original`` with the edit a ``diff`` block shows. No line numbers are needed: each
    hunk (hunks are separated by ``@@`` lines) has ``-`` and context lines that must occur
    exactly once in the file, and become its ``+`` and context lines."""
    hunks: list[list[str]] = [[]]
    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            hunks.append([])
        else:
            hunks[-1].append(line)
    for hunk in (h for h in hunks if h):
        before: list[str] = []
        after: list[str] = []
        for line in hunk:
            if line.startswith("-"):
                before.append(line[1:])
            elif line.startswith("+"):
                after.append(line[1:])
            else:
                text = line[1:] if line.startswith(" ") else line
                before.append(text)
                after.append(text)
        old, new = "\n".join(before) + "\n", "\n".join(after) + "\n"
        count = original.count(old)
        if count != 1:
            raise AssertionError(f"{where}: a hunk's lines occur {count} times in the file")
        original = original.replace(old, new)
    return original
