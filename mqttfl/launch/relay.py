"""What the processes of `mqttfl run` write on stderr: passed on as it comes, except their
error lines, which the launcher keeps.

Each child's stderr is a pipe that a thread of its own reads line by line. A child that
stops on a user error writes one ``mqttfl: error: ...`` line (and exits 2); several
children may meet the same mistake (a broker that refuses the run's credentials refuses
the coordinator and every client). The launcher reports the line that explains why the
run ended as its own one line, instead of letting each child print its own.
"""

from __future__ import annotations

import sys
import threading
from typing import IO

ERROR_PREFIX = b"mqttfl: error: "
#: how long the launcher waits for a child's last lines once it has exited
DRAIN_S = 5.0


class StderrRelay:
    """The reader of one child's stderr: every line goes on to ours, but error lines are
    kept in :attr:`errors` (their text, without the prefix)."""

    def __init__(self, name: str, stream: IO[bytes]) -> None:
        self.name = name
        self.errors: list[str] = []
        self._stream = stream
        self._thread = threading.Thread(target=self._pump, name=f"mqttfl-{name}-stderr")
        self._thread.daemon = True
        self._thread.start()

    def _pump(self) -> None:
        with self._stream:
            for raw in iter(self._stream.readline, b""):
                if raw.startswith(ERROR_PREFIX):
                    self.errors.append(raw[len(ERROR_PREFIX) :].decode(errors="replace").strip())
                    continue
                sys.stderr.write(raw.decode(errors="replace"))
                sys.stderr.flush()

    def error(self, *, timeout: float = DRAIN_S) -> str | None:
        """The child's first error line, once it has written all it will (its stderr
        closed, or ``timeout`` seconds); None if it wrote none."""
        self._thread.join(timeout)
        return self.errors[0] if self.errors else None

    def close(self, *, timeout: float = DRAIN_S) -> None:
        """Pass on what is left of the child's lines (its own children may hold the pipe
        open past ``timeout``: the rest is then dropped with the process)."""
        self._thread.join(timeout)
