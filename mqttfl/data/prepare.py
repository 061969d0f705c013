"""Raw capture files -> per-client shards (``mqttfl data prepare``), and ``data inspect``.

This module is the public entry point; the work lives in three modules, and the
names callers use are re-exported here:

* :mod:`mqttfl.data.labels`: the ``--label`` forms and the label name -> integer rule
  (:func:`resolve_labels`, :data:`ACTIVITIES`);
* :mod:`mqttfl.data.shard_builder`: read each recording, split it by time, group
  recordings into clients and write the shards (:func:`build_shards`,
  :func:`prepare_shards`); its docstring describes the whole ``data prepare``
  behaviour and is the command's ``--help`` text;
* :mod:`mqttfl.data.data_cli`: the ``data prepare`` / ``data inspect`` commands
  (:func:`add_data_commands`) and shard summaries (:func:`inspect_shard`).

Imports point one way: this module -> data_cli -> shard_builder -> labels.
"""

from __future__ import annotations

from mqttfl.data.data_cli import (
    add_data_commands,
    cmd_inspect,
    cmd_prepare,
    format_inspection,
    inspect_shard,
    parse_subcarriers,
)
from mqttfl.data.labels import ACTIVITIES, LabelSpec, resolve_labels
from mqttfl.data.shard_builder import DEFAULT_WINDOW, GROUPINGS, build_shards, prepare_shards

__all__ = [
    "ACTIVITIES",
    "DEFAULT_WINDOW",
    "GROUPINGS",
    "LabelSpec",
    "add_data_commands",
    "build_shards",
    "cmd_inspect",
    "cmd_prepare",
    "format_inspection",
    "inspect_shard",
    "parse_subcarriers",
    "prepare_shards",
    "resolve_labels",
]
