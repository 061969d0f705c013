"""Child processes that end with the process that started them, even one killed by
``kill -9`` (which runs none of its cleanup).

On Linux the child asks the kernel, between fork and exec, to send it SIGTERM when its
parent dies (``prctl(PR_SET_PDEATHSIG)``). The request outlives exec, so a program that
knows nothing of mqttfl (Mosquitto) ends with its parent as well. The kernel sends the
signal when the *thread* that started the child ends: start such children from a thread
that lives as long as they should (the launcher starts everything from its main thread).
Elsewhere nothing is requested; mqttfl's own children also watch their parent
(``MQTTFL_PARENT_PID``).

A process can also name itself (``prctl(PR_SET_NAME)``): the name ps, top and
``pgrep -x`` show, which a forked child would otherwise share with its parent.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
#: bytes of a process's name (``/proc/PID/comm``) the kernel keeps; the rest is cut
NAME_BYTES = 15


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    prctl.restype = ctypes.c_int
    return prctl


def end_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``sig`` when this
    process dies. None where the platform has no such request."""
    prctl = _prctl()  # looked up here: the child only calls it
    if prctl is None:
        return None
    parent = os.getpid()

    def request() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # it died before the request was made
            os.kill(os.getpid(), sig)

    return request


def set_process_name(name: str) -> bool:
    """Name this process ``name`` (cut to :data:`NAME_BYTES`); False where the platform
    has no such call or refuses it."""
    prctl = _prctl()
    if prctl is None:
        return False
    buffer = ctypes.create_string_buffer(name.encode()[:NAME_BYTES])
    return prctl(PR_SET_NAME, ctypes.addressof(buffer), 0, 0, 0) == 0
