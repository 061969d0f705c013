"""Every refusal by a locked broker is one line on stderr and exit 2, on every command.

One broker from `mqttfl broker init` (two client identities, its ACL bound to one run
id) and a live coordinator of that run; around them, each command that talks to a broker
started as a real process, once with credentials the broker refuses and once with an
identity whose ACL does not fit what the command does (a device's --id that is not its
credentials', a run id the ACL does not cover, a device's credentials used by the
coordinator). Each must stop with exactly one line on stderr, ``mqttfl: error: ...``,
exit code 2, and no traceback or exception group anywhere in what it wrote: `mqttfl
clients` (many forked clients) and `mqttfl fleet` (many in one process) as `mqttfl
client` does, `mqttfl run --broker` with the line of the process that met the refusal.

The processes start four at a time and run side by side; the measured rows are printed
(run with ``-s`` to see them).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pytest

from tests.faults import CONFIG, TINY
from tests.helpers import REPO
from tests.locked import Locked, Started, locked_broker, wait_all

pytestmark = pytest.mark.slow

RUN = "refusals"
SETS = [
    arg
    for setting in (
        *TINY,
        f"run_id={RUN}",
        "rounds=1",
        "federation.num_clients=2",
        "federation.min_clients=2",
        "federation.join_timeout_s=900",  # the live coordinator outlives the module
        # A refusal comes at once, whatever this bound; on two cores starved by other work a
        # forked client took over the default 10 s to connect at all, and gave up unrefused.
        "broker.connect_timeout_s=120",
    )
    for arg in ("--set", setting)
]
WRONG = {"MQTTFL_BROKER__PASSWORD": "guess-again"}
OTHER_RUN = ["--set", "run_id=other"]
EACH_S = 300.0  # a bound for the slowest, on two loaded cores; most take seconds
# Processes started side by side: each imports torch, and seventeen at once on two cores
# kept one of a fleet's clients from connecting within its 10 s (not a refusal).
AT_ONCE = 4

# name: (identity whose credentials file is sourced, wrong password?, arguments after the
# command's config and broker, what the line must say)
CASES: dict[str, tuple[str | None, bool, list[str], str]] = {
    "client-wrong-password": ("0", True, ["client", "--id", "0"], "refused user '0'"),
    "client-id-of-another": (
        "0",
        False,
        ["client", "--id", "1"],
        f"client '1' (user '0') may not publish to mqttfl/{RUN}/status/1",
    ),
    "client-run-id-not-in-the-acl": (
        "0",
        False,
        ["client", "--id", "0", *OTHER_RUN],
        "client '0' (user '0') may not publish to mqttfl/other/status/0",
    ),
    "clients-wrong-password": ("0", True, ["clients", "--ids", "0-1"], "refused user '0'"),
    "clients-one-id-of-another": (
        "0",
        False,
        ["clients", "--ids", "0-1"],
        f"client '1' (user '0') may not publish to mqttfl/{RUN}/status/1",
    ),
    "fleet-wrong-password": ("0", True, ["fleet", "--ids", "0-1"], "refused user '0'"),
    "fleet-run-id-not-in-the-acl": (
        "0",
        False,
        ["fleet", "--ids", "0", *OTHER_RUN],
        "client '0' (user '0') may not publish to mqttfl/other/status/0",
    ),
    "fleet-one-id-of-another": (
        "0",
        False,
        ["fleet", "--ids", "0-1"],
        f"client '1' (user '0') may not publish to mqttfl/{RUN}/status/1",
    ),
    "coordinator-wrong-password": (
        "coordinator",
        True,
        ["coordinator", "--out", "run"],
        "refused user 'coordinator'",
    ),
    "coordinator-run-id-not-in-the-acl": (
        "coordinator",
        False,
        ["coordinator", "--out", "run", *OTHER_RUN],
        "(user 'coordinator') may not publish to mqttfl/other/",
    ),
    "coordinator-with-a-devices-credentials": (
        "0",
        False,
        ["coordinator", "--out", "run"],
        f"(user '0') may not publish to mqttfl/{RUN}/",
    ),
    "run-wrong-password": (
        "coordinator",
        True,
        ["run", "--out", "run", "--plain", "--no-local-reference"],
        "refused user 'coordinator'",
    ),
    "run-run-id-not-in-the-acl": (
        "coordinator",
        False,
        ["run", "--out", "run", "--plain", "--no-local-reference", *OTHER_RUN],
        "(user 'coordinator') may not publish to mqttfl/other/",
    ),
    "watch-wrong-password": ("watch", True, ["watch", "--run", RUN, "--once"], "refused user"),
    "watch-without-credentials": (
        None,
        False,
        ["watch", "--run", RUN, "--once"],
        "refused an anonymous login (no user name)",
    ),
}


def command(broker: Locked, args: list[str]) -> list[str]:
    """``mqttfl COMMAND --config ... --broker ... --set ... REST`` (``run`` takes its
    config as an argument; ``watch`` takes none)."""
    name, *rest = args
    if name == "watch":
        return [name, "--broker", broker.url, *rest]
    config = [str(REPO / CONFIG)] if name == "run" else ["--config", str(REPO / CONFIG)]
    return [name, *config, "--broker", broker.url, *SETS, *rest]


@pytest.fixture(scope="module")
def seen() -> Iterator[dict[str, Started]]:
    with locked_broker(RUN) as broker:
        live = broker.start(
            "live-coordinator",
            *command(broker, ["coordinator", "--out", "run"]),
            identity="coordinator",
        )
        started: dict[str, Started] = {}
        try:
            names = list(CASES)
            for first in range(0, len(names), AT_ONCE):  # a few at a time: two cores
                batch = []
                for name in names[first : first + AT_ONCE]:
                    identity, wrong, args, _ = CASES[name]
                    extra = WRONG if wrong else {}
                    started[name] = broker.start(
                        name, *command(broker, args), identity=identity, **extra
                    )
                    batch.append(started[name])
                wait_all(batch, EACH_S)
            assert live.proc.poll() is None, live.stderr[-3000:]  # it was never disturbed
            rows = [
                {"case": name, "rc": s.proc.returncode, "seconds": s.seconds, "stderr": s.stderr}
                for name, s in started.items()
            ]
            sys.stdout.write("\n" + json.dumps(rows, indent=1) + "\n")
            yield started
        finally:
            for one in [live, *started.values()]:
                if one.proc.poll() is None:
                    os.killpg(one.proc.pid, 9)
                    one.proc.wait()


@pytest.mark.parametrize("case", list(CASES))
def test_a_refusal_is_one_line_and_exit_2(seen: dict[str, Started], case: str) -> None:
    started = seen[case]
    line = started.one_error_line()
    assert started.proc.returncode == 2, started.stderr[-3000:]
    assert CASES[case][3] in line, line
