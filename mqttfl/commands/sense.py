"""``mqttfl sense``: an exported model counting from CSI, publishing to MQTT (no torch)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from mqttfl.commands.common import broker_url, credentials, positive
from mqttfl.errors import UsageError
from mqttfl.sensing.adapt import DEFAULT_BUFFER, DEFAULT_EVERY, DEFAULT_HORIZON_S


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive rate in packets/s")
    return value


def add_sense_command(subparsers: Any) -> None:
    sense = subparsers.add_parser(
        "sense",
        help="run an exported model on CSI and publish each reading (Home Assistant discovery)",
        description="Run an exported model on CSI and publish each reading. Its broker "
        "credentials come from MQTTFL_BROKER__USERNAME/__PASSWORD (and __TLS_CA): `set -a; "
        ". ./sensor-NAME.env; set +a` with the file `mqttfl broker init --sensors NAME` wrote.",
    )
    sense.add_argument("directory", type=Path, help="what `mqttfl export` wrote")
    sense.add_argument(
        "--input",
        required=True,
        metavar="SOURCE",
        help="a capture file (any `data prepare` format), mqtt:TOPIC (a gateway's frames: "
        "one ESP32 CSI_DATA line or one msgpack {csi, t} map per message) or shard:PATH "
        "(a shard's test split)",
    )
    sense.add_argument("--broker", help="broker URL, e.g. mqtt://127.0.0.1:1883")
    sense.add_argument("--name", help="sensor name in topics (default <run_id>-client-<id>)")
    sense.add_argument("--once", action="store_true", help="print one reading and exit")
    sense.add_argument("--fast", action="store_true", help="replay a capture as fast as it goes")
    sense.add_argument(
        "--eval", action="store_true", help="score a shard's test split (accuracy, F1, MAE)"
    )
    sense.add_argument("--json", action="store_true", help="JSON output (one object per line)")
    sense.add_argument("--rate", type=_rate, help="replay rate in packets/s (default: recorded)")
    sense.add_argument("--format", dest="capture_format", help="the capture file's format")
    sense.add_argument("--nexmon-chip", help="nexmon captures: the chip")
    sense.add_argument("--nexmon-bw", type=int, help="nexmon captures: bandwidth in MHz")
    sense.add_argument(
        "--readings", type=int, metavar="N", help="stop after N readings (default: run on)"
    )
    adapt = sense.add_argument_group(
        "a model that adapts (FedAPA-S)", "a rolling buffer of the latest windows"
    )
    adapt.add_argument(
        "--buffer", type=positive, default=DEFAULT_BUFFER, metavar="N",
        help=f"windows in the buffer (default {DEFAULT_BUFFER})",
    )  # fmt: skip
    adapt.add_argument(
        "--horizon", type=_rate, default=DEFAULT_HORIZON_S, metavar="SECONDS",
        help=f"drop windows older than this (default {DEFAULT_HORIZON_S:g})",
    )  # fmt: skip
    adapt.add_argument(
        "--every", type=positive, default=DEFAULT_EVERY, metavar="N",
        help=f"re-estimate every N windows (default {DEFAULT_EVERY}; sooner while the buffer fills)",
    )  # fmt: skip
    adapt.add_argument(
        "--stream", action="store_true",
        help="--eval in stream order through the buffer (default: once on the whole session, "
        "as the run evaluates)",
    )  # fmt: skip
    adapt.add_argument(
        "--curve", type=Path, metavar="FILE",
        help="--eval --stream: write accuracy against windows seen (JSON)",
    )  # fmt: skip
    sense.add_argument(
        "--discovery-prefix", default="homeassistant", help="Home Assistant's discovery prefix"
    )
    sense.set_defaults(func=cmd_sense)


def cmd_sense(args: argparse.Namespace) -> int:
    from mqttfl.bus.address import BrokerAddress
    from mqttfl.logs import configure_logging
    from mqttfl.sensing.runner import SenseOptions, Sensor
    from mqttfl.sensing.source import parse_source
    from mqttfl.wire.sensors import check_discovery_prefix, check_name

    configure_logging(None, level="error")  # the sensor writes its own lines (dropped frames)
    try:  # before loading the model: both go into topics
        if args.name is not None:
            check_name(args.name)
        check_discovery_prefix(args.discovery_prefix)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.readings is not None and args.readings < 1:
        raise UsageError("--readings must be a positive whole number")
    broker = BrokerAddress.parse(broker_url(args.broker)) if args.broker else None
    who, connect_timeout_s = None, 10.0
    if broker is not None:  # as every command: MQTTFL_BROKER__* (the sensor says so if refused)
        from mqttfl.config import load_config

        config = load_config(None)
        who, connect_timeout_s = credentials(config), config.broker.connect_timeout_s
    options = SenseOptions(
        directory=args.directory,
        source=parse_source(args.input),
        broker=broker,
        credentials=who,
        connect_timeout_s=connect_timeout_s,
        name=args.name,
        discovery_prefix=args.discovery_prefix,
        once=args.once,
        fast=args.fast,
        evaluate=args.eval,
        json_lines=args.json,
        rate=args.rate,
        capture_format=args.capture_format,
        nexmon_chip=args.nexmon_chip,
        nexmon_bw=args.nexmon_bw,
        max_readings=args.readings,
        buffer=args.buffer,
        horizon_s=args.horizon,
        every=args.every,
        stream=args.stream,
        curve=args.curve,
    )
    return asyncio.run(Sensor(options).run())
