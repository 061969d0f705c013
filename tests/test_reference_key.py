"""The Local reference's cache key covers every source file its code path imports.

The files come from the import graph (:mod:`mqttfl.evaluation.imports`), not a hand
list: changing any one of them changes the key, so a change to, say, the round
selection or the id -> model mapping never serves a stale cached reference.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mqttfl.evaluation.reference import code_digest, code_files

PACKAGE = Path(__file__).resolve().parents[1] / "mqttfl"


def test_the_key_covers_the_files_that_decide_what_a_local_client_learns() -> None:
    files = {f.relative_to(PACKAGE).as_posix() for f in code_files(PACKAGE)}
    for decides in (
        "engine/selection.py",  # which clients train in which round
        "engine/journal.py",  # how rounds are scored
        "wire/ids.py",  # client numbers: seeds, rooms, models
        "algorithms/__init__.py",  # the registry and the [method] table
        "algorithms/local.py",
        "nodes/device.py",
        "models/convnet4.py",  # imported by name, lazily
        "training/loops.py",
        "evaluation/reference.py",
    ):
        assert decides in files, decides
    for never in ("commands/run.py", "bus/transport.py", "nodes/coordinator.py"):
        assert never not in files, never


def test_changing_any_of_those_files_changes_the_key(tmp_path: Path) -> None:
    package = tmp_path / "mqttfl"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    base = code_digest(package)
    files = code_files(package)
    assert len(files) > 20
    for file in files:
        original = file.read_bytes()
        file.write_bytes(original + b"\n# changed\n")
        try:
            assert code_digest(package) != base, file
        finally:
            file.write_bytes(original)
    assert code_digest(package) == base
    outside = package / "commands" / "run.py"  # not on the code path: not in the key
    outside.write_bytes(outside.read_bytes() + b"\n# changed\n")
    assert code_digest(package) == base
