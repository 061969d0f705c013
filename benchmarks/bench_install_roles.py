"""What each role installs: a fresh venv per role, its site-packages size on disk (du).

- ``base``: ``pip install mqttfl``, a coordinator host or a sensing device (no torch);
- ``train``: torch 2.13.0 first, as scripts/setup.sh installs it (the CPU wheel where
  the machine's pip finds it), then ``pip install 'mqttfl[train]'``, a training device;
- ``capture``: ``pip install 'mqttfl[capture]'`` (csiread), vendor capture files;
- ``train+capture``: what every device installed before the split (torch, onnx,
  onnxscript and csiread were all in the base dependencies).

Each venv is built from a copy of the package's sources in a temporary folder and
removed after it is measured. ``--quick``: the base role only. Needs the package index.

    python -m benchmarks.bench_install_roles [--quick]
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, bench_main, log

TORCH = "torch==2.13.0"  # scripts/setup.sh's pin
PIP = ["-m", "pip", "install", "-q", "--disable-pip-version-check"]
# role -> (installed before the package, the package's extras)
ROLES: dict[str, tuple[list[str], str]] = {
    "base": ([], ""),
    "train": ([TORCH], "[train]"),
    "capture": ([], "[capture]"),
    "train+capture": ([TORCH], "[train,capture]"),
}


def package_source(root: Path) -> Path:
    """The files a wheel of this checkout is built from, copied under ``root``."""
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(
        REPO / "mqttfl", source / "mqttfl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    return source


def du_mb(path: Path) -> float:
    """Disk usage of ``path`` in MB (2**20 bytes), as ``du -sk`` counts it."""
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
    return round(int(out.stdout.split()[0]) / 1024, 1)


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def largest(packages_dir: Path, count: int = 8) -> dict[str, float]:
    """The biggest top-level entries of site-packages (package folders, their .libs)."""
    sizes = {
        entry.name: du_mb(entry)
        for entry in packages_dir.iterdir()
        if entry.is_dir() and not entry.name.endswith((".dist-info", "__pycache__"))
    }
    return dict(sorted(sizes.items(), key=lambda item: -item[1])[:count])


def installed(python: Path) -> list[str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(line for line in out.stdout.splitlines() if line.strip())


def pip_install(python: Path, *requirements: str) -> None:
    """``pip install -q``; its output (the machine's index warnings) only when it fails."""
    done = subprocess.run([str(python), *PIP, *requirements], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(requirements)}:\n{done.stderr[-3000:]}")


def measure_role(role: str, source: Path, root: Path) -> dict[str, Any]:
    first, extras = ROLES[role]
    venv = root / f"venv-{role.replace('+', '-')}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    empty = du_mb(site_packages(venv))  # pip and setuptools of a bare venv
    began = time.monotonic()
    if first:
        pip_install(python, *first)
    pip_install(python, f"{source}{extras}")
    seconds = time.monotonic() - began
    packages_dir = site_packages(venv)
    result = {
        "role": role,
        "install": " then ".join(
            [f"pip install {' '.join(first)}"] * bool(first) + [f"pip install 'mqttfl{extras}'"]
        ),
        "site_packages_mb": du_mb(packages_dir),
        "bare_venv_mb": empty,
        "install_s": round(seconds, 1),
        "largest_mb": largest(packages_dir),
        "packages": installed(python),
    }
    shutil.rmtree(venv)
    log(f"{role}: {result['site_packages_mb']:.0f} MB in {seconds:.0f} s")
    return result


def run(quick: bool) -> dict[str, Any]:
    roles = ["base"] if quick else list(ROLES)
    with tempfile.TemporaryDirectory(prefix="mqttfl-install-roles-") as tmp:
        root = Path(tmp)
        source = package_source(root)
        rows = [measure_role(role, source, root) for role in roles]
    return {
        "what": "site-packages of a fresh venv per install role (du -sk), this platform's wheels",
        "platform": f"{platform.system().lower()} {platform.machine()}",
        "roles": rows,
    }


def main() -> None:
    bench_main("install_roles", "installed size per role", run)


if __name__ == "__main__":
    main()
