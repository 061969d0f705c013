"""`mqttfl run`: a local broker, the coordinator and one OS process per client, forked
by one `mqttfl clients` parent so that they share torch's pages (or, with ``--fleets
K``, K fleet processes holding contiguous blocks of the clients; each fleet client still
has its own identity on the broker).

Everything started here is torn down on success, failure, Ctrl-C or SIGTERM: children
run in their own sessions and are terminated (then killed) by us. If this process dies
without its cleanup (``kill -9``), the kernel sends each child, the broker too, SIGTERM
(:mod:`mqttfl.processes`), and mqttfl's children also watch for it (MQTTFL_PARENT_PID).
The coordinator shares the run directory's lock (:func:`mqttfl.paths.claim_run_dir`)
that the command took before it wrote anything there.  If every client exits
while the coordinator still runs (a bad shard makes each one fail at start), the run
stops with an error instead of waiting for clients that will never come.

A run that fails says why in one line: the error line of the process that ended it (a
broker that refuses the run's credentials refuses every process, and each would say so),
kept from its stderr by :mod:`mqttfl.launch.relay`; the rest of what they write is
passed on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from mqttfl.config import RunConfig
from mqttfl.engine.documents import RunSummary, read_summary
from mqttfl.errors import RunAborted, UsageError
from mqttfl.launch.relay import DRAIN_S, StderrRelay
from mqttfl.logs import get_logger
from mqttfl.paths import RunLock
from mqttfl.processes import end_with_parent
from mqttfl.provisioning.broker_init import WATCH
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from mqttfl.wire.control import COORDINATOR

if TYPE_CHECKING:
    from mqttfl.bus.address import BrokerAddress, Credentials

#: ``monitor(broker, credentials)``: entered while the federation runs
MonitorFactory = Callable[["BrokerAddress", "Credentials"], AbstractContextManager[object]]
#: thread pools a child would size to the machine: OpenMP (torch), OpenBLAS (numpy), MKL
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CHILD_GRACE_S = 30.0
POLL_S = 0.2


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit(143)`` while the federation runs, so that the
    ``finally`` blocks stop the children and the broker as they do on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def default_out_dir(config: RunConfig) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.run_id}-{stamp}"


class LocalFederation:
    def __init__(
        self,
        config: RunConfig,
        config_path: str | None,
        overrides: list[str],
        out_dir: Path,
        broker_url: str | None = None,
        *,
        coordinator_console: str = "info",
        client_console: str = "warning",
        fleets: int | None = None,
        monitor: MonitorFactory | None = None,
        lock: RunLock | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = overrides
        self.out_dir = out_dir
        self.broker_url = broker_url
        self.coordinator_console = coordinator_console
        self.client_console = client_console
        # entered while the federation runs: the live view (mqttfl.monitor.progress)
        self.monitor = monitor
        self.fleets = fleets  # None: one process per client
        self.lock = lock  # of out_dir, passed down to the coordinator (else it takes it)
        self.credentials_dir: Path | None = None  # the local broker's <id>.env files
        self.broker: LocalBroker | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.relays: dict[str, StderrRelay] = {}  # each child's stderr, read as it comes
        self.credentials: dict[str, dict[str, str]] = {}  # per identity, for the local broker
        self.log = get_logger(run_id=config.run_id, client_id="launcher")

    def command(self, role: str, *extra: str) -> list[str]:
        """The argv of one role's process (``clients``, ``fleet``, ``coordinator``). A hook: a
        subclass may rewrite it (benchmarks/federation.py points clients at a proxy)."""
        cmd = [sys.executable, "-m", "mqttfl", role, "--broker", str(self.broker_url)]
        if self.config_path:
            cmd += ["--config", self.config_path]
        for item in self.overrides:
            cmd += ["--set", item]
        return cmd + list(extra)

    def _start_local_broker(self) -> None:
        """A Mosquitto of this run only, locked like `broker init` does it: generated
        credentials per identity and an ACL, so nobody else on this machine can drive the
        run (publish a start, a downlink or another client's upload)."""
        from mqttfl.provisioning.broker_init import init_broker

        ids = [str(index) for index in range(self.config.federation.num_clients)]
        work = self.out_dir / "broker"
        setup = init_broker(work, ids, run_id=self.config.run_id, port=free_port(), force=True)
        self.credentials = {name: setup.env(name) for name in (COORDINATOR, WATCH, *ids)}
        self.credentials_dir = setup.env_file(COORDINATOR).parent
        # Kept before start(): a signal during the start still stops it in shutdown().
        self.broker = LocalBroker(
            work, port=setup.port, conf=setup.conf.read_text(), end_with_parent=True
        )
        self.broker.start()
        self.broker_url = self.broker.url
        self.log.info("broker.started", url=self.broker_url, acl=str(setup.out / "acl"))

    def _spawn(self, name: str, cmd: list[str], console_level: str, identity: str) -> None:
        env = {
            # Each child trains with train.torch_threads (1) threads: OpenMP and BLAS pools
            # sized to the machine would, beside five more processes, spin for cores
            # the others hold (docs/benchmarks/devices.md, "A busy machine"). A user's setting wins.
            **dict.fromkeys(THREAD_VARIABLES, str(self.config.train.torch_threads)),
            **os.environ,
            **self.credentials.get(identity, {}),
            "MQTTFL_PARENT_PID": str(os.getpid()),
            "MQTTFL_CONSOLE_LEVEL": console_level,
            "MQTTFL_LOG_DIR": str(self.out_dir / "logs"),
        }
        shared: tuple[int, ...] = ()
        if name == "coordinator" and self.lock is not None:
            env.update(self.lock.child_env())
            shared = (self.lock.fd,)
        child = subprocess.Popen(
            end_with_parent(cmd),
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=shared,
        )
        self.children[name] = child
        assert child.stderr is not None
        self.relays[name] = StderrRelay(name, child.stderr)

    def _failed(self, what: str, names: list[str], *, otherwise: str) -> RunAborted:
        """The run's one line: ``what`` failed, with the first error line of ``names``
        (the processes that did); ``otherwise`` when none of them wrote one."""
        for name in names:
            line = self.relays[name].error() if name in self.relays else None
            if line is not None:
                return RunAborted(f"{what}: {line}")
        return RunAborted(otherwise)

    def start_clients(self, ids: list[str]) -> None:
        """One `mqttfl clients` parent that forks a process per client (each still its own
        device: session, last will, shard, state, log), sharing torch's pages."""
        from mqttfl.nodes.fleet import format_ids

        extra = ["--ids", format_ids(ids), "--state-dir", str(self.out_dir / "clients")]
        if self.credentials_dir is not None:
            extra += ["--credentials-dir", str(self.credentials_dir)]
        self._spawn("clients", self.command("clients", *extra), self.client_console, "")

    def start_fleet(self, index: int, ids: list[str]) -> None:
        """One `mqttfl fleet` process for ``ids``; the cores are divided among the fleets."""
        from mqttfl.nodes.fleet import default_workers, format_ids

        extra = [
            "--ids",
            format_ids(ids),
            "--state-dir",
            str(self.out_dir / "clients"),
            "--workers",
            str(max(1, default_workers() // (self.fleets or 1))),
        ]
        if self.credentials_dir is not None:
            extra += ["--credentials-dir", str(self.credentials_dir)]
        self._spawn(f"fleet-{index}", self.command("fleet", *extra), self.client_console, "")

    def _start_clients(self) -> None:
        ids = [str(index) for index in range(self.config.federation.num_clients)]
        if self.fleets is None:
            self.start_clients(ids)
            return
        from mqttfl.nodes.fleet import split_ids

        for index, block in enumerate(split_ids(ids, self.fleets)):
            self.start_fleet(index, block)

    def run(self) -> RunSummary:
        with _sigterm_as_exit():
            return self._run()

    def _check_local_data(self) -> None:
        """Shards named by the config must be here: every client runs on this machine."""
        from mqttfl.data.sources import check_local_data

        check_local_data(self.config.data, self.config.federation.num_clients)

    def _run(self) -> RunSummary:
        self._check_local_data()
        num_clients = self.config.federation.num_clients
        if self.fleets is not None and not 1 <= self.fleets <= num_clients:
            raise UsageError(
                f"--fleets {self.fleets}: between 1 and federation.num_clients ({num_clients})"
            )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.broker_url is None:
                self._start_local_broker()
            self._spawn(
                "coordinator",
                self.command("coordinator", "--out", str(self.out_dir)),
                self.coordinator_console,
                COORDINATOR,
            )
            self._start_clients()
            with self._monitor():
                code = self._wait_coordinator()
            if code != 0:
                failed = f"the coordinator failed (exit {code})"
                raise self._failed(
                    failed, ["coordinator"], otherwise=f"{failed}; see {self.out_dir / 'logs'}"
                )
            self._wait_clients(CHILD_GRACE_S)
            return read_summary(self.out_dir / "summary.json")
        finally:
            self.shutdown()

    def _monitor(self) -> AbstractContextManager[object]:
        if self.monitor is None or self.broker_url is None:
            return nullcontext()
        from mqttfl.bus.address import BrokerAddress, Credentials

        env = self.credentials.get(WATCH)
        if env is None:  # a broker of the user's (--broker): the config's identity
            b = self.config.broker
            who = Credentials(b.username, b.password, b.tls_ca, b.tls_cert, b.tls_key)
        else:
            who = Credentials(
                env.get("MQTTFL_BROKER__USERNAME"),
                env.get("MQTTFL_BROKER__PASSWORD"),
                env.get("MQTTFL_BROKER__TLS_CA"),
            )
        return self.monitor(BrokerAddress.parse(self.broker_url), who)

    def _wait_coordinator(self) -> int:
        """The coordinator's exit code; raise MqttflError if the clients are all gone.

        Clients that all failed (none exited 0) end the wait at once.  Clients that all
        finished normally leave the coordinator ``final_metrics_timeout_s`` plus
        ``CHILD_GRACE_S`` to write its summary and exit.
        """
        coordinator = self.children["coordinator"]
        grace = self.config.federation.final_metrics_timeout_s + CHILD_GRACE_S
        all_gone_since: float | None = None
        while True:
            code = coordinator.poll()
            if code is not None:
                return code
            codes = {
                name: child.poll() for name, child in self.children.items() if name != "coordinator"
            }
            if codes and None not in codes.values():
                logs = self.out_dir / "logs"
                if 0 not in codes.values():
                    self.log.error("clients.all_exited", exit_codes=codes)
                    exited = f"every client exited ({_describe_exits(codes)})"
                    raise self._failed(
                        exited,
                        list(codes),
                        otherwise=f"{exited} while the coordinator was still running; see "
                        f"their logs in {logs}",
                    )
                all_gone_since = all_gone_since or time.monotonic()
                if time.monotonic() - all_gone_since > grace:
                    self.log.error("coordinator.lingering", exit_codes=codes)
                    raise RunAborted(
                        f"every client exited, and the coordinator was still running "
                        f"{grace:.0f} s later; see {logs}"
                    )
            time.sleep(POLL_S)

    def _wait_clients(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for name, child in self.children.items():
            if name != "coordinator":
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.log.warning("client.lingering", client=name)

    def shutdown(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for child in self.children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child, signal.SIGKILL)
                child.wait()
        deadline = time.monotonic() + DRAIN_S
        for relay in self.relays.values():
            relay.close(timeout=max(0.1, deadline - time.monotonic()))
        if self.broker is not None:
            self.broker.stop()


def _describe_exits(codes: dict[str, int | None]) -> str:
    """``exit 2: client-0, client-1; killed by signal 9: client-2``."""
    groups: dict[str, list[str]] = {}
    for name, code in codes.items():
        what = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        groups.setdefault(what, []).append(name)
    return "; ".join(f"{what}: {', '.join(names)}" for what, names in groups.items())


def _signal_group(child: subprocess.Popen[bytes], sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(child.pid, sig)
