"""The coordinator, its server sides, the wire and the CLI never load torch (issue 9).

Each check runs in a fresh interpreter, so an import that drags torch in anywhere on the
path shows up as 'torch' in sys.modules.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

MODULES = [
    "mqttfl",
    "mqttfl.commands.main",
    "mqttfl.config",
    "mqttfl.wire",
    "mqttfl.wire.control",
    "mqttfl.algorithms",
    "mqttfl.engine.rounds",
    "mqttfl.nodes.coordinator",
    "mqttfl.provisioning.broker_init",
    "mqttfl.testing.loadclient",
    "mqttfl.evaluation.report",
    "mqttfl.evaluation.reference",
    "mqttfl.nodes.device",
    "mqttfl.commands.data",
    "mqttfl.commands.run",
    "mqttfl.commands.watch",
    "mqttfl.commands.broker",
    "mqttfl.bus.transport",
    "mqttfl.monitor.view",
    "mqttfl.launch.local",
    "mqttfl.evaluation.compare",
]


def _torch_free(code: str) -> subprocess.CompletedProcess[str]:
    script = f"{code}\nimport sys\nassert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]"
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO
    )


@pytest.mark.parametrize("module", MODULES)
def test_importing_leaves_torch_out(module: str) -> None:
    result = _torch_free(f"import {module}")
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_server_side_of_every_prototype_method_aggregates_without_torch() -> None:
    code = """
import numpy as np
from mqttfl.algorithms import get_algorithm
from mqttfl.algorithms.base import Context, Upload
from mqttfl.wire.schemas import ClientInfo
for name in ("fedapa", "fedapa-global-avg", "fedapa-global-avg-client-protos", "fedproto", "fedsap", "local"):
    algorithm = get_algorithm(name)
    ctx = Context(num_classes=4, embed_dim=8, rounds=3, seed=0, params=algorithm.params())
    server = algorithm.server(ctx)
    uploads = []
    for cid in ("0", "1"):
        info = ClientInfo(cid, "tiny", (0, 1), 10, (24, 52))
        schema = algorithm.upload_schema(ctx, info)
        body = {}
        if "classes" in schema.fields:
            body = {"classes": np.arange(2), "prototypes": np.ones((2, 8), np.float32)}
            if "counts" in schema.fields:
                body["counts"] = np.ones(2, np.int64)
        schema.validate(body)
        uploads.append(Upload(cid, info, body))
    server.round_params(1)
    server.aggregate(1, uploads)
"""
    result = _torch_free(code)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_server_side_of_every_weight_method_checks_and_aggregates_without_torch() -> None:
    code = """
import numpy as np
from mqttfl.algorithms import get_algorithm
from mqttfl.algorithms.base import Context, Upload
from mqttfl.wire.schemas import ClientInfo
for name, arch in (("fedavg", "large"), ("fedcaring", "tiny"), ("wifed", "middle"),
                   ("fedpam", "cnn"), ("fedali", "transformer")):
    algorithm = get_algorithm(name)
    ctx = Context(num_classes=4, embed_dim=8, rounds=3, seed=0, params=algorithm.params())
    server = algorithm.server(ctx)
    uploads = []
    for cid in ("0", "1"):
        info = ClientInfo(cid, arch, (0, 1), 10, (24, 52))
        schema = algorithm.upload_schema(ctx, info)
        body = {}
        for key, spec in schema.fields.items():
            if hasattr(spec, "shape"):
                shape = tuple(n if isinstance(n, int) else 2 for n in spec.shape)
                body[key] = np.full(shape, 0.5, spec.dtype)
            else:
                body[key] = spec.min_value if isinstance(spec.min_value, int) else 0.5
        schema.validate(body)
        uploads.append(Upload(cid, info, body))
    server.aggregate(1, uploads)
"""
    result = _torch_free(code)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
    "args", [["--help"], ["broker", "init", "--clients", "2", "--out", "{tmp}"]]
)
def test_cli_commands_run_without_torch(args: list[str], tmp_path: Path) -> None:
    argv = [a.replace("{tmp}", str(tmp_path / "b")) for a in args]
    code = f"""
from mqttfl.commands.main import main
try:
    main({argv!r})
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
"""
    result = _torch_free(code)
    assert result.returncode == 0, result.stderr[-2000:]
