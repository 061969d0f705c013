"""The `mqttfl` command line. User errors print one line and exit 2, never a traceback.

So does a command whose install lacks a package it needs (torch on a base install): it
names the extra to install (:mod:`mqttfl.commands.extras`).

Each command is a module of this package with an ``add_*_command`` that registers it and
a ``cmd_*`` that runs it; this module only assembles the parser and reports errors.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mqttfl.bus.refusal import Refused
from mqttfl.commands.extras import missing_package, missing_package_message, not_installed
from mqttfl.errors import MqttflError, first_mqttfl_error

#: each command: the module that registers it and its ``add_*`` function, in the order of
#: ``mqttfl --help``
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("mqttfl.commands.run", "add_run_command"),
    "coordinator": ("mqttfl.commands.coordinator", "add_coordinator_command"),
    "client": ("mqttfl.commands.client", "add_client_command"),
    "clients": ("mqttfl.commands.clients", "add_clients_command"),
    "fleet": ("mqttfl.commands.fleet", "add_fleet_command"),
    "models": ("mqttfl.commands.models", "add_models_command"),
    "data": ("mqttfl.commands.data", "add_data_commands"),
    "compare": ("mqttfl.commands.compare", "add_compare_command"),
    "report": ("mqttfl.commands.report", "add_report_command"),
    "broker": ("mqttfl.commands.broker", "add_broker_commands"),
    "watch": ("mqttfl.commands.watch", "add_watch_command"),
    "logs": ("mqttfl.commands.logs", "add_logs_command"),
    "export": ("mqttfl.commands.export", "add_export_command"),
    "sense": ("mqttfl.commands.sense", "add_sense_command"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, that command's parser alone, so that a
    process imports the modules of the command it runs and no other."""
    parser = argparse.ArgumentParser(prog="mqttfl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, adder) in COMMANDS.items():
        if command is None or name == command:
            getattr(importlib.import_module(module), adder)(sub)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word), if it is one."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(named_command(argv)).parse_args(argv)
    package = not_installed(args.command)
    if package is not None:
        sys.stderr.write(f"mqttfl: error: {missing_package_message(_command(args), package)}\n")
        return 2
    try:
        return int(args.func(args))
    except MqttflError as exc:
        sys.stderr.write(f"mqttfl: error: {exc}\n")
        return 2
    except ModuleNotFoundError as exc:
        package = missing_package(exc)
        if package is None:
            raise
        sys.stderr.write(f"mqttfl: error: {missing_package_message(_command(args), package)}\n")
        return 2
    except BaseExceptionGroup as group:  # asyncio.TaskGroup's; a refusal is the root cause
        error = first_mqttfl_error(group, prefer=Refused)
        package = missing_package(group)
        if error is not None:
            message = str(error)
        elif package is not None:
            message = missing_package_message(_command(args), package)
        else:
            raise
        sys.stderr.write(f"mqttfl: error: {message}\n")
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("mqttfl: interrupted\n")
        return 130


def _command(args: argparse.Namespace) -> str:
    """``mqttfl data prepare``: the command and its subcommand, as typed."""
    words = ["mqttfl", args.command]
    sub = getattr(args, f"{args.command}_command", None)
    if isinstance(sub, str):
        words.append(sub)
    return " ".join(words)
