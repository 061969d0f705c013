"""`mqttfl clients`: many client devices on one machine, one OS process each, forked
from one parent that imported torch and the package once.

A client process that starts alone pays torch's import in private memory: the
relocated pages of its libraries, Python's module objects (about 250 MB a
process). Forked from a parent that already holds them, every client shares those
pages copy-on-write, and pays only for what it writes: its shard, model, optimizer,
activations and MQTT session. Each child is still a whole device:

- its own OS process, named for its run and id with a pid file beside its state
  (:mod:`mqttfl.pidfile`), killable alone with ``kill -9``, whose last will the broker
  then fires;
- its own MQTT session, credentials, shard, model, state file and log file
  (``client-<id>.jsonl``), exactly as `mqttfl client --id <id>` would run it.

The parent builds nothing itself: it imports, forks one child per id (a few at a time,
so that the shards are not all simulated at once), reaps them, logs each exit, and
forwards SIGTERM and SIGINT to them. It holds no thread while it forks (a forked child
keeps only the forking thread, and a lock held by another would never be released).
It exits 0 if any client finished its run, 1 if none did; if the process that started
it (MQTTFL_PARENT_PID) goes away, it stops its clients and exits.

A client the broker refuses (its login, or a publish its ACL denies) says so to the
parent on a pipe instead of on stderr: the parent stops every client and exits with that
one line (exit 2), as `mqttfl client` would, not with a line (or a traceback) per client;
a refusal is a mistake of the setup that no client can get past by retrying.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.refusal import Refused
from mqttfl.config import RunConfig
from mqttfl.errors import MqttflError, first_mqttfl_error
from mqttfl.files import one_line
from mqttfl.logs import get_logger

POLL_S = 0.1
#: children building their shards at once (a synthetic room's simulation peaks at about
#: 100 MB above the shard it leaves)
STARTING_AT_ONCE = 4
#: a child counts as started once its shard is built and its runner is up; the parent
#: waits at most this long for that before it forks the next batch
START_WAIT_S = 60.0
#: a refusal's line on the pipe to the parent: one write of at most PIPE_BUF bytes is
#: never interleaved with another child's
REPORT_BYTES = 4000


def preload(config: RunConfig) -> None:
    """Import what every client imports, before forking: torch, the runner, the method's
    modules."""
    import torch

    from mqttfl.algorithms import get_algorithm
    from mqttfl.data.sources import run_client_shard  # noqa: F401
    from mqttfl.nodes.client import ClientRunner  # noqa: F401

    get_algorithm(config.method)
    torch.set_num_threads(config.train.torch_threads)


class Forks:
    """The children of one `mqttfl clients`: fork, reap, forward signals."""

    def __init__(
        self,
        config: RunConfig,
        broker: BrokerAddress,
        ids: Sequence[str],
        *,
        state_dir: Path,
        credentials: dict[str, Credentials],
        log_dir: Path,
        prepare_child: Callable[[str], None],
    ) -> None:
        """``prepare_child(client_id)`` runs first in each child: its log file, and the
        watch on its parent (MQTTFL_PARENT_PID is this process then)."""
        self.config = config
        self.broker = broker
        self.ids = list(ids)
        self.state_dir = state_dir
        self.credentials = credentials
        self.log_dir = log_dir  # where each child writes client-<id>.jsonl
        self.prepare_child = prepare_child
        self.children: dict[int, str] = {}  # pid -> client id
        self.codes: dict[str, int] = {}  # client id -> exit code (negative: signal)
        self.stopping = False
        self.refusals: dict[str, str] = {}  # client id -> the broker's refusal, in order
        self._reports = os.pipe()  # children's refusals: (read end, write end)
        self._partial = b""
        for end in self._reports:
            os.set_blocking(end, False)
        self.log = get_logger(run_id=config.run_id, client_id="clients")
        self.launcher = int(os.environ.get("MQTTFL_PARENT_PID") or 0)

    # --- in the parent ---------------------------------------------------------------
    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self._forward) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            preload(self.config)
            gc.collect()
            gc.freeze()  # the imported objects: a child's collections leave their pages shared
            for start in range(0, len(self.ids), STARTING_AT_ONCE):
                batch = self.ids[start : start + STARTING_AT_ONCE]
                for client_id in batch:
                    if self.stopping:
                        break
                    self._fork(client_id)
                self._wait_started(batch)
            while self.children:
                self._reap(block=False)
                self._check_launcher()
                time.sleep(POLL_S)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop_all()
            self._read_reports()
            for end in self._reports:
                os.close(end)
        finished = sum(1 for code in self.codes.values() if code == 0)
        self.log.info("clients.exited", finished=finished, failed=len(self.codes) - finished)
        if self.refusals:
            first, *others = self.refusals.values()
            more = f" ({len(others)} more clients were refused)" if others else ""
            raise Refused(first + more)
        return 0 if finished else 1

    def _fork(self, client_id: str) -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(self._child(client_id))
        self.children[pid] = client_id
        self.log.info("client.forked", client=client_id, pid=pid)

    def _wait_started(self, batch: Sequence[str]) -> None:
        """Until each of ``batch`` has written its log's first event (its shard is built)
        or exited, so that only a few shards are simulated at once."""
        deadline = time.monotonic() + START_WAIT_S
        waiting = [c for c in batch if c in self.children.values()]
        while waiting and time.monotonic() < deadline and not self.stopping:
            self._reap(block=False)
            self._check_launcher()
            waiting = [c for c in waiting if c in self.children.values() and not self._up(c)]
            time.sleep(POLL_S)

    def _up(self, client_id: str) -> bool:
        path = self.log_dir / f"client-{client_id}.jsonl"
        try:
            return b'"client.started"' in path.read_bytes()[-65536:]
        except OSError:
            return False

    def _read_reports(self) -> None:
        """Take the refusals children wrote on the pipe; the first stops every client."""
        while True:
            try:
                chunk = os.read(self._reports[0], 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            for line in lines:
                client_id, _, message = line.decode(errors="replace").partition("\t")
                self.refusals.setdefault(client_id, message)
                self.log.warning("client.refused", client=client_id, error=message)
        if self.refusals and not self.stopping:
            self._forward(signal.SIGTERM, None)

    def _reap(self, *, block: bool) -> None:
        self._read_reports()
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            client_id = self.children.pop(pid, None)
            if client_id is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self.codes[client_id] = code
            level = self.log.info if code == 0 else self.log.warning
            level("client.exited", client=client_id, pid=pid, code=code)

    def _check_launcher(self) -> None:
        if self.launcher and os.getppid() != self.launcher and not self.stopping:
            self.log.warning("launcher.gone", launcher=self.launcher)
            self._forward(signal.SIGTERM, None)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        """Stop every client (each says ``offline`` on its way out)."""
        self.stopping = True
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _stop_all(self) -> None:
        if self.children:
            self._forward(signal.SIGTERM, None)
        deadline = time.monotonic() + 10
        while self.children and time.monotonic() < deadline:
            self._reap(block=False)
            time.sleep(POLL_S)
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.children:
            self._reap(block=True)

    # --- in a child --------------------------------------------------------------------
    def _child(self, client_id: str) -> int:
        """A client device's life; never returns into the parent's code."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        os.close(self._reports[0])
        try:
            os.environ["MQTTFL_PARENT_PID"] = str(os.getppid())
            from mqttfl.nodes.client_process import run_client_device

            self.prepare_child(client_id)
            return run_client_device(
                self.config,
                client_id,
                self.broker,
                state_dir=self.state_dir,
                credentials=self.credentials.get(client_id),
            )
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        except KeyboardInterrupt:
            return 130
        except BaseException as exc:  # a client's task group wraps what stopped it
            error = first_mqttfl_error(exc, prefer=Refused)
            if error is None:
                traceback.print_exc()
                return 1
            self._report(client_id, error)
            return 2
        finally:
            sys.stdout.flush()
            sys.stderr.flush()

    def _report(self, client_id: str, error: MqttflError) -> None:
        """A refusal goes to the parent, which says it once for all; any other error
        is this client's own line."""
        if isinstance(error, Refused):
            line = f"{client_id}\t{one_line(error, limit=REPORT_BYTES // 4)}\n".encode()
            try:
                os.write(self._reports[1], line)
                return
            except OSError:
                pass  # the pipe is full: the line goes to stderr instead
        sys.stderr.write(f"mqttfl: error: client {client_id}: {one_line(error, limit=2000)}\n")
