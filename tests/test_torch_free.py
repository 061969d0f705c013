"""The coordinator, its server sides, the wire and the CLI never load torch .

Each check runs in a fresh interpreter, so an import that drags torch in anywhere on the
path shows up as 'torch' in sys.modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqttfl.commands.extras import missing_package, missing_package_message
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
    "mqttfl.monitor.live",
    "mqttfl.launch.local",
    "mqttfl.evaluation.compare",
    # what `pip install mqttfl` (no extras) runs: coordinator, report, sense
    "mqttfl.commands.coordinator",
    "mqttfl.commands.report",
    "mqttfl.commands.sense",
    "mqttfl.commands.extras",
    "mqttfl.sensing.runner",
    "mqttfl.data.capture",
    # `mqttfl logs` reads any host's logs
    "mqttfl.commands.logs",
    "mqttfl.monitor.logview",
    "mqttfl.monitor.logtext",
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


def test_the_command_line_imports_no_optional_package() -> None:
    """`mqttfl --help` on a base install: no extra's package (nor scipy or matplotlib,
    which only some commands use) is loaded to assemble the parser."""
    code = """
import sys
import mqttfl.commands.main
optional = {"torch", "onnx", "onnxscript", "csiread", "sklearn", "mlxtend", "scipy", "matplotlib"}
loaded = sorted(optional & {m.split(".")[0] for m in sys.modules})
assert not loaded, loaded
"""
    result = _torch_free(code)
    assert result.returncode == 0, result.stderr[-2000:]


# The packages of the extras made unimportable, as on a base install: `import torch` and
# importlib.util.find_spec("torch") both see no torch.
WITHOUT_EXTRAS = """
import sys
for name in ("torch", "onnx", "onnxscript", "csiread", "sklearn", "mlxtend"):
    sys.modules[name] = None
from mqttfl.commands.main import main
sys.exit(main(sys.argv[1:]))
"""


def _without_extras(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["client", "--id", "0", "--broker", "mqtt://127.0.0.1:1"], "mqttfl client"),
        (["models"], "mqttfl models"),
        (["run", str(REPO / "configs" / "fedapa-csi.toml"), "--out", "run"], "mqttfl run"),
        (["compare", str(REPO / "configs" / "fedapa-csi.toml"), "--out", "c"], "mqttfl compare"),
    ],
)
def test_a_command_without_its_extra_names_it_in_one_line(
    args: list[str], command: str, tmp_path: Path
) -> None:
    result = _without_extras(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"mqttfl: error: '{command}' needs torch: install the training extra: "
        "pip install 'mqttfl[train]'\n"
    )
    if command in ("mqttfl run", "mqttfl compare"):  # told before they start anything
        assert not list(tmp_path.iterdir())


def test_missing_packages_are_found_in_exception_groups_and_others_are_not() -> None:
    torch_missing = ModuleNotFoundError("No module named 'torch'", name="torch")
    nested = ExceptionGroup("tasks", [ValueError("x"), ExceptionGroup("inner", [torch_missing])])
    assert missing_package(nested) == "torch"
    assert missing_package(torch_missing) == "torch"
    # a torch that is there but lacks a submodule, or a package of no extra: raised as is
    assert missing_package(ModuleNotFoundError("x", name="torch._C")) is None
    assert missing_package(ModuleNotFoundError("x", name="yaml")) is None
    assert missing_package_message("mqttfl data prepare", "csiread") == (
        "'mqttfl data prepare' needs csiread: install the capture extra: "
        "pip install 'mqttfl[capture]'"
    )
    assert missing_package_message("mqttfl report", "matplotlib") == (
        "'mqttfl report' needs matplotlib: it comes with the base package: pip install mqttfl"
    )
    assert missing_package_message("mqttfl data prepare", "sklearn") == (
        "'mqttfl data prepare' needs scikit-learn: install the images extra: "
        "pip install 'mqttfl[images]'"
    )


def test_a_missing_module_of_no_extra_still_raises(tmp_path: Path) -> None:
    code = """
import sys
import mqttfl.commands.report as report
def broken(args):
    import yaml_that_is_not_there  # noqa: F401
report.cmd_report = broken
from mqttfl.commands.main import main
sys.exit(main(["report", "x"]))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "No module named 'yaml_that_is_not_there'" in result.stderr
