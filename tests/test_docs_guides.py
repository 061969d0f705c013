"""Every shell block a reader types in the tutorials and how-to guides is run, as the page
says, so a changed command or flag fails here rather than for a reader.

The convention (``tests/docs_blocks.py``): ```` ```console ```` blocks are run, one bash per
block, in a fresh folder per page, on real processes and a real Mosquitto on a free
loopback port; ``<!-- test: ... -->`` before a block and ``<!-- test-page: ... -->`` on a
page say what a test machine runs differently (a smaller job, a process left running).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker, free_port
from tests._shared_data import require_shared, shared_data_dir
from tests.docs_blocks import (
    SHELL_FENCES,
    Block,
    Page,
    apply_diff,
    guide_pages,
    read_page,
    substitutions,
)
from tests.helpers import REPO

DOCS = REPO / "docs"
PAGES = guide_pages(DOCS)
BLOCK_OPTIONS = frozenset(
    {"skip", "background", "name", "ready", "after", "when", "exit", "expect", "sub"}
)
PAGE_OPTIONS = frozenset({"sub", "broker", "checkout", "shared", "timeout"})
#: what a page's folder holds besides what its blocks write (a copy: pages write there)
BESIDE = ("configs", "deploy", "broker", "clients")
#: left out of a checkout copy
NOT_COPIED = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "runs",
    "site",
    "logs",
    "client-state",
    "broker-setup",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "results",
    "*.egg-info",
)


def _ids() -> list[str]:
    return [f"{p.parent.name}/{p.name}" for p in PAGES]


# --- the convention holds on every page --------------------------------------------------
def test_the_guides_exist() -> None:
    assert len(PAGES) >= 10, PAGES


@pytest.mark.parametrize("path", PAGES, ids=_ids())
def test_every_shell_block_is_a_console_block_with_known_directives(path: Path) -> None:
    page = read_page(path)
    assert set(page.options) <= PAGE_OPTIONS, (path.name, page.options)
    for block in page.blocks:
        assert block.lang not in SHELL_FENCES, (
            f"{block.where}: a block a reader types is ```console (and so it is run)"
        )
        assert set(block.options) <= BLOCK_OPTIONS, (block.where, block.options)
        if block.lang == "console":
            assert block.commands(), f"{block.where}: a console block without a '$ ' command"
            if "skip" in block.options:
                assert block.option("skip"), f'{block.where}: skip="why" says why'
        elif block.options and not block.title:
            pytest.fail(f"{block.where}: a directive before a block that is not run")


# --- running them --------------------------------------------------------------------------
def _kill(proc: subprocess.Popen[bytes]) -> None:
    """The block's whole process group: what it left running in the background too."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            proc.poll()  # reap the block's shell: a zombie would keep the group alive
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
    proc.wait()


def _prepare(page: Page, work: Path) -> dict[str, str]:
    """The page's folder and the environment its blocks run in."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("MQTTFL_LOG_DIR", None)
    if page.option("checkout") is not None:
        shutil.copytree(REPO, work, ignore=NOT_COPIED, symlinks=True)
        env["PYTHONPATH"] = str(work)
    else:
        work.mkdir()
        for name in BESIDE:
            shutil.copytree(REPO / name, work / name)
    return env


def _substituted(text: str, page: Page, block: Block, values: dict[str, str]) -> str:
    """The page's substitutions where they apply; the block's own must each apply."""
    own = len(substitutions(page, block)) - len(page.options.get("sub", []))
    for index, (old, new) in enumerate(substitutions(page, block)):
        if index >= len(substitutions(page, block)) - own:
            assert old in text, f"{block.where}: substitution {old!r} finds nothing"
        text = text.replace(old, new.format(**values))
    return text


def _wait_for(
    proc: subprocess.Popen[bytes], output: Path, text: str, timeout: float, where: str
) -> None:
    """Until a background block's output holds ``text`` (it must not exit first)."""
    deadline = time.monotonic() + timeout
    while text not in output.read_text(errors="replace"):
        assert proc.poll() is None, (
            f"{where}: it exited before saying {text!r}:\n"
            + output.read_text(errors="replace")[-4000:]
        )
        assert time.monotonic() < deadline, f"{where}: no {text!r} within {timeout} s"
        time.sleep(0.5)


def run_page(path: Path, tmp_path: Path) -> None:
    page = read_page(path)
    work = tmp_path / "page"
    env = _prepare(page, work)
    timeout = float(page.option("timeout") or 600)
    values = {"port": str(free_port()), "port2": str(free_port())}
    if page.option("shared") is not None:  # real recordings: CI has them, a clone may not
        require_shared(*str(page.option("shared")).split("/"))
        values["shared"] = str(shared_data_dir())
        env["MQTTFL_SHARED_DATA"] = values["shared"]
    background: dict[str, subprocess.Popen[bytes]] = {}
    outputs: dict[str, Path] = {}
    broker = LocalBroker(tmp_path / "broker") if page.option("broker") is not None else None
    try:
        if broker is not None:
            broker.start()
            values["broker"] = broker.url
        for number, block in enumerate(page.blocks):
            if block.title is not None and "skip" not in block.options:
                target = work / block.title
                text = _substituted(block.text, page, block, values)
                if block.lang == "diff":
                    target.write_text(apply_diff(target.read_text(), text, block.where))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
                continue
            if block.lang != "console" or "skip" in block.options:
                continue
            after = block.option("after")
            if after is not None:
                proc = background[after]
                try:
                    code = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{block.where}: {after} still runs after {timeout} s")
                assert code == 0, f"{after} exited {code}:\n{outputs[after].read_text()[-4000:]}"
            when = block.option("when")
            if when is not None:
                name, _, text = when.partition(":")
                _wait_for(background[name], outputs[name], text, timeout, block.where)
            commands = [_substituted(c, page, block, values) for c in block.commands()]
            script = "set -euo pipefail\n" + "\n".join(commands) + "\n"
            if "background" in block.options:
                name = block.option("name") or f"block-{number}"
                outputs[name] = tmp_path / f"{name}.out"
                with outputs[name].open("wb") as log:
                    background[name] = subprocess.Popen(
                        ["bash", "-c", script],
                        cwd=work,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                time.sleep(1.0)  # a broker's listener, a coordinator's first connect
                ready = block.option("ready")
                if ready is not None:
                    _wait_for(background[name], outputs[name], ready, timeout, block.where)
                continue
            done = subprocess.run(
                ["bash", "-c", script],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            said = done.stdout + done.stderr
            want = int(block.option("exit") or 0)
            assert done.returncode == want, (
                f"{block.where}: exit {done.returncode}, not {want}\n$ "
                + "\n$ ".join(commands)
                + f"\n{said[-4000:]}"
                + "".join(f"\n--- {n}:\n{p.read_text()[-2000:]}" for n, p in outputs.items())
            )
            expect = block.option("expect")
            if expect is not None:
                assert expect in said, f"{block.where}: {expect!r} not in:\n{said[-4000:]}"
    finally:
        for proc in reversed(list(background.values())):
            _kill(proc)
        if broker is not None:
            broker.stop()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a page is several federations in a row, on a loaded machine
@pytest.mark.parametrize("path", PAGES, ids=_ids())
def test_the_guide_runs(path: Path, tmp_path: Path) -> None:
    page = read_page(path)
    if not any(b.lang == "console" and "skip" not in b.options for b in page.blocks):
        pytest.skip("no block to run")
    run_page(path, tmp_path)
