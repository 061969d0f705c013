"""Shared pieces of the benchmarks: machine facts, JSON results, statistics, log reading."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
WORK = RESULTS / "work"  # run directories of the benchmarks' federations (git-ignored)


def machine() -> dict[str, Any]:
    """What the figures were measured on, and how busy the machine was."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    versions: dict[str, str] = {}
    for name in ("numpy", "torch", "aiomqtt", "msgpack", "flwr"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = str(getattr(module, "__version__", "?"))
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "mosquitto": _mosquitto_version(),
    }


def _mosquitto_version() -> str | None:
    import subprocess

    try:
        from mqttfl.provisioning.local_broker import mosquitto_binary

        out = subprocess.run([mosquitto_binary(), "-h"], capture_output=True, text=True, timeout=5)
    except Exception:
        return None
    first = (out.stdout or out.stderr).splitlines()
    return first[0].strip() if first else None


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_result(name: str, data: dict[str, Any], *, quick: bool, command: str) -> Path:
    """Write benchmarks/results/<name>.json (with machine, date and command) and return it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'-quick' if quick else ''}.json"
    document = {
        "benchmark": name,
        "quick": quick,
        "date": now_utc(),
        "command": command,
        "machine": machine(),
        **data,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=False, default=_json_default) + "\n")
    return path


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def stats(values: Iterable[float]) -> dict[str, float]:
    """Median first (the figure we report on a noisy machine), then the spread."""
    data = sorted(float(v) for v in values)
    if not data:
        return {"n": 0}
    return {
        "median": statistics.median(data),
        "min": data[0],
        "max": data[-1],
        "p90": data[min(len(data) - 1, round(0.9 * (len(data) - 1)))],
        "n": len(data),
    }


def time_calls(
    fn: Callable[[], Any], *, repeats: int, warmup: int = 1, min_time_s: float = 0.0
) -> list[float]:
    """Seconds per call of ``fn``, ``repeats`` times (after ``warmup`` untimed calls).

    With ``min_time_s`` each sample loops ``fn`` until that long has passed and reports
    the mean per call, so that microsecond calls are not dominated by timer resolution.
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        count = 0
        began = time.perf_counter()
        while True:
            fn()
            count += 1
            elapsed = time.perf_counter() - began
            if elapsed >= min_time_s:
                break
        samples.append(elapsed / count)
    return samples


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a killed process
    return rows


def event_time(event: dict[str, Any]) -> float:
    """The structlog ISO timestamp of an event, as epoch seconds."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def log(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def bench_main(
    name: str,
    description: str,
    run: Callable[[bool], dict[str, Any]],
    *,
    command: str | None = None,
) -> None:
    """The command line of a benchmark: ``run(quick)`` written to benchmarks/results/NAME.json
    (``command``: how it was run, where that is not ``python -m benchmarks.bench_NAME``)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    _write_run(name, run, args.quick, command)


def _write_run(
    name: str, run: Callable[[bool], dict[str, Any]], quick: bool, command: str | None = None
) -> None:
    os.chdir(REPO)  # configs/ and `python -m` paths are relative to the checkout
    path = write_result(
        name,
        run(quick),
        quick=quick,
        command=f"{command or f'python -m benchmarks.bench_{name}'}{' --quick' if quick else ''}",
    )
    log(f"wrote {path}")


def child_process_main(
    name: str,
    description: str,
    measure: Callable[[bool], Any],
    run: Callable[[bool], dict[str, Any]],
) -> None:
    """The command line of a benchmark that measures in a fresh child process.

    ``--child`` prints ``measure(quick)`` as JSON (the parent's ``run`` starts it);
    otherwise ``run(quick)`` is written to benchmarks/results/NAME.json.
    """
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.chdir(REPO)
        sys.stdout.write(json.dumps(measure(args.quick)))
        return
    _write_run(name, run, args.quick)


#: the Intel 5300 activity recordings of ../shared/data (May, August and undated)
INTEL5300 = "csi-samples/intel5300-activity"


def intel5300_root(data: Any) -> Path:
    """The Intel 5300 recordings' folder for a config's ``[data]``; FileNotFoundError
    names it when it is missing."""
    from mqttfl.data.sources import shared_data_root

    root = shared_data_root(data) / INTEL5300
    if not root.is_dir():
        raise FileNotFoundError(root)
    return Path(root)


def pss_mb(pid: int) -> float | None:
    """A process's proportional set size (MB), from /proc/<pid>/smaps_rollup; None if gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def children_of(parent: int) -> list[int]:
    """The processes whose parent is ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry))
    return found
