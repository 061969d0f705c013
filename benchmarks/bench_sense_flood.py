"""`mqttfl sense` under a flood: 10,000 frames/s on its input topic for 60 s (15 s with
--quick), over a real local mosquitto, while the gateway goes on sending its 20 frames/s.

One federation (the synthetic rooms on an ESP32, 64 subcarriers: windows of 24 packets at
20 Hz, 1.2 s) is exported; `mqttfl sense --input mqtt:TOPIC` reads the topic. A separate
process floods it with valid frames (msgpack, I/Q as bytes, each stamped with the time it
was sent) at QoS 0, the cheapest way to send many. Measured:

- the sense process's RSS before the flood (median of 5 s), its peak (sampled every
  0.2 s) and after (median of the last 5 s, 20 s after the flood);
- the frames it counts as dropped, by reason (its summary line on SIGTERM);
- readings before, during and after the flood;
- from the flood's end, the time to the next reading and to the first *fresh* reading, one
  whose window ends in a frame sent after the flood (its ``window_end`` is the frames' own
  stamp), next to one window's duration (1.2 s);
- that SIGTERM ends it with exit 0 and the availability topic ``offline``.

Goals: peak RSS <= 150 MB; readings resume within one window after the flood.

    python -m benchmarks.bench_sense_flood [--quick]
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, WORK, bench_main, log

TOPIC = "csi/flood-bench"
NAME = "flood-bench"
GATEWAY_HZ = 20.0  # the synthetic rooms' packet rate (sensor.json sample_rate_hz)
WINDOW_S = 24 / GATEWAY_HZ
GOAL_RSS_MB = 150.0
SAMPLE_S = 0.2
FEDERATION = [
    "rounds=1",
    "federation.num_clients=2",
    "data.device=esp32",
    "data.window=24",
    "data.samples_per_client=120",
    "model.name=middle",
]

# The flooder: its own process, so the measuring one is not slowed. Prints one JSON line.
FLOODER = """
import json, sys, time
import msgpack, numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
port, topic, rate, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"flooder-{time.time()}")
client.max_queued_messages_set(0)
client.connect("127.0.0.1", port)
client.loop_start()
rng = np.random.default_rng(0)
buffers = [rng.integers(-60, 60, 128, dtype=np.int8).tobytes() for _ in range(64)]
began = time.monotonic()
sent = 0
while (elapsed := time.monotonic() - began) < seconds:
    stamp = time.time()
    while sent < int(elapsed * rate):
        client.publish(topic, msgpack.packb({"csi": buffers[sent % 64], "t": stamp}), qos=0)
        sent += 1
    time.sleep(0.001)
ended = time.time()
client.loop_stop()
client.disconnect()
print(json.dumps({"sent": sent, "seconds": time.monotonic() - began, "ended": ended}))
"""


def flood(port: int, topic: str, *, rate_hz: float, seconds: float) -> dict[str, Any]:
    """Send ``rate_hz`` frames/s to ``topic`` for ``seconds`` from a child process; its
    count, duration and wall-clock end."""
    done = subprocess.run(
        [sys.executable, "-c", FLOODER, str(port), topic, str(rate_hz), str(seconds)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=seconds + 120,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


class Gateway:
    """A gateway's normal frames, ``GATEWAY_HZ`` a second, each stamped with its time."""

    def __init__(self, port: int, topic: str) -> None:
        import msgpack
        import numpy as np
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self._pack = msgpack.packb
        self._iq = np.random.default_rng(1).integers(-40, 40, 128, dtype=np.int8).tobytes()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"gw-{time.time()}")
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        began, sent = time.monotonic(), 0
        while not self._stop.is_set():
            due = began + sent / GATEWAY_HZ
            self._stop.wait(max(due - time.monotonic(), 0.0))
            frame = self._pack({"csi": self._iq, "t": time.time()})
            self.client.publish(self.topic, frame, qos=0)
            sent += 1

    def __enter__(self) -> Gateway:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.client.loop_stop()
        self.client.disconnect()


def rss_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid`` in MB (empty once it is gone)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


class Watched:
    """A running `mqttfl sense --json`: its readings (arrival time, window end) and its
    RSS every SAMPLE_S seconds, gathered by two threads."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        self.readings: list[tuple[float, float]] = []  # (time.time() seen, window_end)
        self.rss: list[tuple[float, float]] = []  # (time.time(), MB)
        self.stderr = ""
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            seen = time.time()
            state = json.loads(line)
            end = datetime.fromisoformat(state["window_end"].replace("Z", "+00:00"))
            self.readings.append((seen, end.timestamp()))

    def _sample(self) -> None:
        while self.process.poll() is None:
            now = rss_mb(self.process.pid)
            if "VmRSS" in now:
                self.rss.append((time.time(), now["VmRSS"]))
            time.sleep(SAMPLE_S)

    def stop(self, *, timeout: float = 60) -> int:
        """SIGTERM, then its exit code (stderr kept)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            _, self.stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.stderr = self.process.communicate()
        for thread in self._threads:
            thread.join(timeout=5)
        return int(self.process.returncode)

    def rss_between(self, start: float, end: float) -> list[float]:
        return [mb for t, mb in self.rss if start <= t <= end]


def dropped(stderr: str) -> dict[str, int]:
    """The frames the summary line counts as dropped, by reason."""
    found = re.search(r"(\d+) frames dropped \(([^)]*)\)", stderr)
    if found is None:
        return {}
    counts = {
        reason: int(n) for reason, n in (part.rsplit(" ", 1) for part in found[2].split(", "))
    }
    return {"total": int(found[1]), **counts}


def retained_availability(port: int, name: str) -> str | None:
    """What the broker holds on the sensor's availability topic."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    seen: list[str] = []
    got = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"look-{time.time()}")

    def on_message(_c: Any, _u: Any, message: Any) -> None:
        seen.append(message.payload.decode())
        got.set()

    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.subscribe(f"mqttfl/sensor/{name}/availability", qos=1)
    client.loop_start()
    got.wait(5)
    client.loop_stop()
    client.disconnect()
    return seen[-1] if seen else None


def under_flood(
    export: Path,
    port: int,
    *,
    rate_hz: float,
    seconds: float,
    after_s: float,
    settle_s: float,
    min_after_s: float = 0.0,
) -> dict[str, Any]:
    """`mqttfl sense` on a topic flooded at ``rate_hz`` for ``seconds``, the gateway's
    frames before, during and after it: the figures of the module's docstring. After the
    flood it waits up to ``after_s`` for a fresh reading, then ``settle_s`` (and at least
    ``min_after_s`` from the flood's end) to measure the RSS after."""
    argv = [sys.executable, "-m", "mqttfl", "sense", str(export), "--input", f"mqtt:{TOPIC}"]
    argv += ["--broker", f"mqtt://127.0.0.1:{port}", "--name", NAME, "--json"]
    with Gateway(port, TOPIC):
        sensor = Watched(argv)
        try:
            deadline = time.monotonic() + 120
            while not sensor.readings and time.monotonic() < deadline:
                time.sleep(0.2)
            if not sensor.readings:
                raise RuntimeError(f"no reading within 120 s: {sensor.process.stderr}")
            quiet_from = time.time()
            time.sleep(settle_s)
            before = sensor.rss_between(quiet_from, time.time())
            flood_began = time.time()
            flooded = flood(port, TOPIC, rate_hz=rate_hz, seconds=seconds)
            flood_end = float(flooded["ended"])
            deadline = time.monotonic() + after_s  # a fresh reading, or give up
            while time.monotonic() < deadline and not any(
                window_end > flood_end for _, window_end in sensor.readings
            ):
                time.sleep(0.1)
            time.sleep(max(settle_s, min_after_s - (time.time() - flood_end)))
            end = time.time()
        finally:
            code = sensor.stop()
    availability = retained_availability(port, NAME)
    readings = sensor.readings
    after = [seen for seen, _ in readings if seen > flood_end]
    fresh = [seen for seen, window_end in readings if window_end > flood_end]
    peak = max((mb for _, mb in sensor.rss), default=0.0)
    return {
        "flood": {
            "rate_hz": rate_hz,
            "seconds": seconds,
            "sent": flooded["sent"],
            "achieved_hz": flooded["sent"] / flooded["seconds"],
        },
        "rss_mb": {
            "before": statistics.median(before) if before else None,
            "peak": peak,
            "after": statistics.median(sensor.rss_between(end - settle_s, end)),
        },
        "dropped": dropped(sensor.stderr),
        "readings": {
            "before_flood": sum(1 for seen, _ in readings if seen < flood_began),
            "during_flood": sum(1 for seen, _ in readings if flood_began <= seen <= flood_end),
            "after_flood": len(after),
        },
        "resume": {
            "next_reading_s": (after[0] - flood_end) if after else None,
            "fresh_reading_s": (fresh[0] - flood_end) if fresh else None,
            "window_s": WINDOW_S,
        },
        "exit": {"code": code, "availability": availability},
        "stderr_tail": sensor.stderr[-1500:],
    }


def export_model() -> Path:
    """A finished one-round federation's client 0, exported (no shard)."""
    run, export = WORK / "sense-flood", WORK / "sense-flood-export"
    argv = [sys.executable, "-m", "mqttfl", "run", "configs/fedapa-csi.toml", "--out", str(run)]
    argv.append("--no-local-reference")
    for item in ["method=fedapa", *FEDERATION]:
        argv += ["--set", item]
    subprocess.run(argv, check=True, cwd=REPO, capture_output=True, timeout=1800)
    export_argv = [sys.executable, "-m", "mqttfl", "export", str(run), "--client", "0"]
    subprocess.run([*export_argv, "--out", str(export)], check=True, cwd=REPO, capture_output=True)
    return export


def run(quick: bool) -> dict[str, Any]:
    from mqttfl.provisioning.local_broker import LocalBroker

    WORK.mkdir(parents=True, exist_ok=True)
    seconds = 15.0 if quick else 60.0
    export = export_model()
    log(f"flooding `mqttfl sense` at 10,000 frames/s for {seconds:.0f} s")
    with tempfile.TemporaryDirectory() as tmp, LocalBroker(Path(tmp) / "broker") as broker:
        result = under_flood(
            export,
            broker.port,
            rate_hz=10_000.0,
            seconds=seconds,
            after_s=60.0,
            settle_s=5.0,
            min_after_s=20.0,
        )
    rss, resume = result["rss_mb"], result["resume"]
    fresh = resume["fresh_reading_s"]
    result["goals"] = {
        "peak_rss_mb": {"goal": GOAL_RSS_MB, "figure": rss["peak"], "met": rss["peak"] <= 150},
        "resume_within_one_window": {
            "goal_s": WINDOW_S,
            "figure_s": fresh,
            "met": fresh is not None and fresh <= WINDOW_S,
        },
    }
    log(
        f"RSS {rss['before']:.0f} -> peak {rss['peak']:.0f} -> {rss['after']:.0f} MB; dropped "
        f"{result['dropped']}; next reading {resume['next_reading_s']} s, fresh {fresh} s "
        f"after the flood; exit {result['exit']}; load {os.getloadavg()[0]:.1f}"
    )
    return {"what": "mqttfl sense flooded at 10,000 frames/s", **result}


def main() -> None:
    bench_main("sense_flood", "mqttfl sense under a flood of frames", run)


if __name__ == "__main__":
    main()
