"""Child processes that end with the process that started them, even one killed by
``kill -9`` (which runs none of its cleanup).

On Linux the child asks the kernel to send it SIGTERM when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, made by ``setpriv`` just before it execs the program). The
request outlives exec, so a program that knows nothing of mqttfl (Mosquitto) ends with
its parent as well. The kernel sends the
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
import shutil
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


def end_with_parent(cmd: list[str], sig: str = "TERM") -> list[str]:
    """``cmd`` made to receive SIG``sig`` when this process dies: run through util-linux's
    ``setpriv --pdeathsig``, which makes the request and then execs ``cmd``. Nothing runs
    in Python between fork and exec (a ``preexec_fn`` there can deadlock the child of a
    process with threads, such as the launcher's stderr relays). ``cmd`` as it is where
    setpriv is missing (mqttfl's own children still watch MQTTFL_PARENT_PID)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is None:
        return cmd
    return [setpriv, "--pdeathsig", sig, "--", *cmd]


def set_process_name(name: str) -> bool:
    """Name this process ``name`` (cut to :data:`NAME_BYTES`); False where the platform
    has no such call or refuses it."""
    prctl = _prctl()
    if prctl is None:
        return False
    buffer = ctypes.create_string_buffer(name.encode()[:NAME_BYTES])
    return prctl(PR_SET_NAME, ctypes.addressof(buffer), 0, 0, 0) == 0
