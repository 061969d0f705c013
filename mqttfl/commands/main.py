"""The `mqttfl` command line. User errors print one line and exit 2, never a traceback.

So does a command whose install lacks a package it needs (torch on a base install): it
names the extra to install (:mod:`mqttfl.commands.extras`).

Each command is a module of this package with an ``add_*_command`` that registers it and
a ``cmd_*`` that runs it; this module only assembles the parser and reports errors.
"""

from __future__ import annotations

import argparse
import sys

from mqttfl.bus.refusal import Refused
from mqttfl.commands.broker import add_broker_commands
from mqttfl.commands.client import add_client_command
from mqttfl.commands.clients import add_clients_command
from mqttfl.commands.compare import add_compare_command
from mqttfl.commands.coordinator import add_coordinator_command
from mqttfl.commands.data import add_data_commands
from mqttfl.commands.export import add_export_command
from mqttfl.commands.extras import missing_package, missing_package_message, not_installed
from mqttfl.commands.fleet import add_fleet_command
from mqttfl.commands.logs import add_logs_command
from mqttfl.commands.models import add_models_command
from mqttfl.commands.report import add_report_command
from mqttfl.commands.run import add_run_command
from mqttfl.commands.sense import add_sense_command
from mqttfl.commands.watch import add_watch_command
from mqttfl.errors import MqttflError, first_mqttfl_error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqttfl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_command(sub)
    add_coordinator_command(sub)
    add_client_command(sub)
    add_clients_command(sub)
    add_fleet_command(sub)
    add_models_command(sub)
    add_data_commands(sub)
    add_compare_command(sub)
    add_report_command(sub)
    add_broker_commands(sub)
    add_watch_command(sub)
    add_logs_command(sub)
    add_export_command(sub)
    add_sense_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
