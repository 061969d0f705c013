"""Raw capture files -> per-client shards (``mqttfl data prepare``), and ``data inspect``.

This module is the public entry point; the work lives in three modules, and the
names callers use are re-exported here:

* :mod:`mqttfl.data.labels`: the ``--label`` forms and the label name -> integer rule
  (:func:`resolve_labels`, :data:`ACTIVITIES`);
* :mod:`mqttfl.data.shard_builder`: read each recording, split it by time, group
  recordings into clients and write the shards (:func:`build_shards`,
  :func:`prepare_shards`); its docstring describes the whole ``data prepare``
  behaviour and is the command's ``--help`` text;
* :mod:`mqttfl.data.inspect`: shard summaries (:func:`inspect_shard`) and the
  ``--subcarriers`` syntax; the commands themselves are :mod:`mqttfl.commands.data`.

Imports point one way: this module -> inspect, shard_builder -> labels.
"""

from __future__ import annotations

from mqttfl.data.inspect import format_inspection, inspect_shard, parse_subcarriers
from mqttfl.data.labels import ACTIVITIES, LabelSpec, resolve_labels
from mqttfl.data.shard_builder import DEFAULT_WINDOW, GROUPINGS, build_shards, prepare_shards

__all__ = [
    "ACTIVITIES",
    "DEFAULT_WINDOW",
    "GROUPINGS",
    "LabelSpec",
    "build_shards",
    "format_inspection",
    "inspect_shard",
    "parse_subcarriers",
    "prepare_shards",
    "resolve_labels",
]
