"""Where the real data of ../shared/data lives, for tests that need it.

``MQTTFL_SHARED_DATA`` overrides the default ``<repo>/../shared/data``.  A fresh
clone has no such folder: tests then skip with a reason instead of failing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """The shared data folder (it may not exist)."""
    env = os.environ.get("MQTTFL_SHARED_DATA")
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data").resolve()


def require_shared(*parts: str) -> Path:
    """``shared_data_dir()/parts``, or skip the calling test when it is missing."""
    path = shared_data_dir().joinpath(*parts)
    if not path.exists():
        if os.environ.get("MQTTFL_REQUIRE_SHARED_DATA"):  # CI always has it: fail, don't skip
            pytest.fail(f"real data not found at {path}, and MQTTFL_REQUIRE_SHARED_DATA is set")
        pytest.skip(
            f"real data not found at {path} (set MQTTFL_SHARED_DATA or provide ../shared/data)"
        )
    return path
