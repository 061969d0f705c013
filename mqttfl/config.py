"""Run configuration: TOML file, then ``MQTTFL_*`` environment, then ``--set`` overrides.

Every table forbids unknown keys, and every validation failure is turned into a
:class:`~mqttfl.errors.ConfigError` that names the dotted key (``federation.fraction``).
The ``[method]`` table is free-form here; each algorithm validates it with its own model.
"""

from __future__ import annotations

import os
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from mqttfl.errors import ConfigError
from mqttfl.models.names import MODEL_NAMES
from mqttfl.wire.ids import DOT_NAMES, client_number


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FederationConfig(_Table):
    num_clients: int = Field(6, ge=1, le=10_000)
    fraction: float = Field(1.0, gt=0.0, le=1.0)
    min_clients: int = Field(2, ge=1)
    round_timeout_s: float = Field(120.0, gt=0)
    join_timeout_s: float = Field(120.0, gt=0)
    # A selected client that has not acknowledged the round's start by then is left out
    # of the round (and of later selections until it shows life again).
    ack_timeout_s: float = Field(15.0, gt=0)
    # How long to keep re-announcing a round that has fewer than min_clients uploads.
    max_round_attempts: int = Field(5, ge=1)
    # Uploads above this many bytes are rejected before decoding.
    max_upload_bytes: int = Field(16_000_000, ge=1024)
    # After the last round, how long to wait for the clients' final metrics, counted
    # from the newest of them: the wait goes on while they keep coming.
    final_metrics_timeout_s: float = Field(30.0, gt=0)
    # At least this long from one round's start to the next one's (0: as fast as they
    # go): a demo paced so that a person can kill and restart clients by hand.
    pace_s: float = Field(0.0, ge=0, le=3600)
    # "rounds": synchronous rounds (the default). "buffered": FedBuff (Nguyen et al.,
    # AISTATS 2022): clients train on the newest version they hold, the coordinator
    # aggregates every buffer_size uploads, staleness-weighted, and refuses uploads more
    # than max_staleness versions old (mqttfl/engine/buffered.py). `rounds` counts versions.
    mode: Literal["rounds", "buffered"] = "rounds"
    buffer_size: int = Field(4, ge=1)
    max_staleness: int = Field(4, ge=0, le=1000)
    # s(τ) for an upload τ versions old: "fedbuff" 1/sqrt(1+τ) (Nguyen et al. 2022, Sec. 5),
    # "polynomial" (1+τ)^-staleness_exponent (FedAsync, Xie et al. 2019, Sec. 5.2), "constant" 1.
    staleness_weighting: Literal["fedbuff", "polynomial", "constant"] = "fedbuff"
    staleness_exponent: float = Field(0.5, gt=0.0, le=10.0)
    # Which downlinks a client scores on its test split (and reports metrics for):
    # "every_round", each one; "when_trained", only those of the rounds it trained in,
    # and the last round's (every client), as a simulation evaluates only the clients it
    # sampled: an idle client applies the downlink and does no more, or, where a method's
    # broadcast replaces the one before (FedAvg and the methods built on it), fetches no
    # broadcast until it is chosen (then the retained one before its round) or the run's
    # last round comes. Rounds mode only.
    evaluate: Literal["every_round", "when_trained"] = "every_round"
    # Keys of [train] and [data] a device may set for itself, besides its data path and
    # thread count (mqttfl/nodes/manifest.py): e.g. ["train.local_epochs"] for devices
    # that train as long as their hardware allows. Every other key is the run's.
    device_keys: list[str] = Field(default_factory=list, max_length=32)


class DataConfig(_Table):
    source: Literal["synthetic", "shards", "espectre", "digits", "mnist"] = "synthetic"
    # synthetic CSI: time steps per window and samples per client
    window: int = Field(64, ge=1)
    stride: int | None = Field(None, ge=1)
    samples_per_client: int = Field(400, ge=10)
    # synthetic CSI: the NIC every room records with, or "per-room" (one each)
    device: Literal[
        "per-room",
        "intel5300",
        "atheros-ht20",
        "atheros-ht20-56",
        "esp32",
        "atheros-ht40",
        "nexmon-vht80",
    ] = "per-room"
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    # How test windows are chosen: "window", a share of every recording session's windows
    # (the papers' per-client 80/20); "session", whole sessions the client never trained
    # on (a room recorded on some days and used on others). See mqttfl/data/sessions.py.
    split: Literal["window", "session"] = "window"
    # shards: a directory holding client-{id}/ shard directories; espectre: the folder
    # holding espectre/ (mqttfl/data/espectre_files.py looks elsewhere when it is empty)
    path: str = ""
    # image partitions
    partition: Literal["dirichlet", "pathological", "nway_kshot"] = "dirichlet"
    partition_params: dict[str, float] = Field(default_factory=dict)
    # Recipe search: each client holds out this stratified share of its TRAINING split
    # and scores on it instead of its test split (never read then). 0: off.
    validation_fraction: float = Field(0.0, ge=0.0, lt=1.0)


def _known_model(name: str) -> str:
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
    return name


# A name build_model accepts, checked without importing torch.
ModelName = Annotated[str, AfterValidator(_known_model)]


class ModelConfig(_Table):
    name: ModelName = "large"
    embed_dim: int = Field(256, ge=2)
    num_classes: int = Field(21, ge=2)
    # Model heterogeneity: architecture per client id, cycled (Table III, right half).
    per_client: list[ModelName] = Field(default_factory=list)

    def arch_for(self, client_id: int) -> str:
        if self.per_client:
            return self.per_client[client_id % len(self.per_client)]
        return self.name

    def arch_of(self, client_id: str) -> str:
        """The architecture client ``client_id`` runs: the one id -> model mapping of
        mqttfl (``per_client`` cycled by :func:`~mqttfl.wire.ids.client_number`), used by
        clients, the checks before a run, and the Local and pooled references alike."""
        return self.arch_for(client_number(client_id))


class TrainConfig(_Table):
    """Local training; defaults are the FedAPA paper's Section VI-D."""

    # "adam" (momentum unused) lets a method be trained as FedAli's paper trains (Sec. 5.1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.5, ge=0, lt=1)
    weight_decay: float = Field(1e-5, ge=0)
    batch_size: int = Field(16, ge=1)
    local_epochs: int = Field(1, ge=1)
    torch_threads: int = Field(1, ge=1)


class BrokerConfig(_Table):
    username: str | None = None
    password: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    keepalive_s: int = Field(15, ge=2)
    # The broker's packet limit (AWS IoT Core 131072, Azure IoT Hub 262144, EMQX 1048576
    # by default); a larger message travels in chunks. 0: no limit (Mosquitto's default).
    max_message_bytes: int = Field(0, ge=0)
    # The site (edge broker, bridged to the central one) this client connects through.
    site: str = Field("", pattern=r"^([A-Za-z0-9_.-]{1,64})?$")
    # How long a client or the coordinator tries to reach the broker before giving up.
    connect_timeout_s: float = Field(10.0, gt=0)
    # How long a client goes on with no live coordinator of its run (or no broker) before
    # it stops, saying so: a device never outlives its run.
    orphan_timeout_s: float = Field(600.0, gt=0)


# A noise multiplier above this turns every upload into noise (given or solved for ε).
MAX_NOISE = 1e4


class PrivacyConfig(_Table):
    """Differential privacy on every upload (off by default, the papers' setting).

    Prototype methods clip each window's embedding to ``clip`` and noise the class sums
    and counts; weight methods clip the client's update to ``clip`` and noise it
    (DP-FedAvg). Either ``noise_multiplier`` is given, or ``epsilon`` and the noise is
    solved so that the planned uploads spend it; with ``epsilon``, a client stops before
    an upload that would exceed it. The mechanisms: mqttfl/privacy/mechanism.py.
    """

    enabled: bool = False
    clip: float | None = Field(None, gt=0, le=1e4, allow_inf_nan=False)
    noise_multiplier: float | None = Field(None, gt=0, le=MAX_NOISE, allow_inf_nan=False)
    epsilon: float | None = Field(None, gt=0, le=1e4, allow_inf_nan=False)
    delta: float = Field(1e-5, gt=0, lt=1, allow_inf_nan=False)
    # Counts are noised (σ_n = sqrt(2)·z windows); a class is uploaded only when its noisy
    # count reaches count_threshold·σ_n, so the set of classes is protected as well.
    count_threshold: float = Field(3.0, ge=0, le=100, allow_inf_nan=False)


class LoggingConfig(_Table):
    level: Literal["debug", "info", "warning", "error"] = "info"


def _own_directory(run_id: str) -> str:
    """A run id names a directory of its own (``<state dir>/<run_id>/``, on every device)."""
    if run_id in DOT_NAMES:
        raise ValueError(
            f"{run_id!r} names no directory of its own (client state is kept in "
            "<state dir>/<run_id>/): give it a letter or a digit"
        )
    return run_id


class RunConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MQTTFL_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    run_id: Annotated[str, AfterValidator(_own_directory)] = Field(
        "mqttfl", pattern=r"^[A-Za-z0-9_.-]{1,64}$"
    )
    method: str = "fedapa"
    rounds: int = Field(30, ge=1)
    seed: int = 0
    federation: FederationConfig = FederationConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    method_params: dict[str, object] = Field(default_factory=dict, alias="method_params")
    broker: BrokerConfig = BrokerConfig()
    logging: LoggingConfig = LoggingConfig()
    privacy: PrivacyConfig = PrivacyConfig()

    @model_validator(mode="after")
    def _check_privacy(self) -> RunConfig:
        p = self.privacy
        if not p.enabled:  # a budget that nothing enforces must not look like one
            for key, field in PrivacyConfig.model_fields.items():
                if key != "enabled" and getattr(p, key) != field.default:
                    raise ConfigError(
                        f"privacy.{key}",
                        "is set while privacy.enabled is false, so the run would train "
                        "without differential privacy; set privacy.enabled = true, or "
                        "remove the key",
                    )
        if p.enabled and p.clip is None:
            raise ConfigError("privacy.clip", "required when privacy.enabled is true")
        if p.enabled and p.noise_multiplier is None and p.epsilon is None:
            raise ConfigError(
                "privacy.epsilon",
                "set a target epsilon (the noise is solved for the planned rounds) "
                "or privacy.noise_multiplier",
            )
        return self

    @model_validator(mode="after")
    def _check_device_keys(self) -> RunConfig:
        tables = {"train": self.train.model_dump(), "data": self.data.model_dump()}
        for key in self.federation.device_keys:
            table, _, name = key.partition(".")
            if table not in tables or name not in tables[table]:
                raise ConfigError(
                    "federation.device_keys",
                    f"{key!r} is not a key of [train] or [data] (a device may set only those)",
                )
        return self

    @model_validator(mode="after")
    def _check_packet_limit(self) -> RunConfig:
        if 0 < self.broker.max_message_bytes < 4096:
            raise ConfigError("broker.max_message_bytes", "must be 0 (no limit) or at least 4096")
        return self

    def recorded(self) -> dict[str, Any]:
        """The config as results record it (summary.json, --resume): everything but the
        [broker] table, which holds credentials and how to connect, not the experiment."""
        return self.model_dump(mode="json", exclude={"broker"})

    @model_validator(mode="after")
    def _check_min_clients(self) -> RunConfig:
        if self.federation.min_clients > self.federation.num_clients:
            # Not a ValueError: pydantic lets it through, naming the key it is about.
            raise ConfigError(
                "federation.min_clients",
                f"{self.federation.min_clients} exceeds federation.num_clients "
                f"({self.federation.num_clients})",
            )
        return self

    @model_validator(mode="after")
    def _check_buffer(self) -> RunConfig:
        fed = self.federation
        if fed.mode == "buffered" and fed.evaluate != "every_round":
            raise ConfigError(
                "federation.evaluate",
                "must be every_round in buffered mode (a client trains on whatever version "
                "it holds, so there is no round it trained in to score)",
            )
        if fed.mode == "buffered" and fed.buffer_size > fed.num_clients:
            raise ConfigError(
                "federation.buffer_size",
                f"{fed.buffer_size} exceeds federation.num_clients ({fed.num_clients}): "
                "the buffer would never fill",
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: --set (init kwargs), then MQTTFL_* environment, then the file.
        return (init_settings, env_settings, _FileSource(settings_cls))


# The TOML tree of the load_config call in progress (None outside one).
_FILE_TREE: ContextVar[dict[str, Any] | None] = ContextVar("_FILE_TREE", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """The parsed TOML file, as the lowest-priority settings source."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_TREE.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, object]:
        return dict(_FILE_TREE.get() or {})


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``a.b=VALUE``; the value is read as a TOML literal, else as a string."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(item, "an override must look like KEY=VALUE")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(path), f"'{part}' is not a table")
        node = child
    node[path[-1]] = value


def _rename_method_table(tree: dict[str, Any]) -> dict[str, object]:
    # In TOML, `method` is both the method name and the [method] table of its
    # hyper-parameters; a table value means the latter (its `name` key, if any,
    # is the method name).
    tree = dict(tree)
    method = tree.get("method")
    if isinstance(method, dict):
        params = dict(method)
        name = params.pop("name", None)
        tree["method_params"] = {**tree.get("method_params", {}), **params}
        if name is not None:
            tree["method"] = name
        else:
            tree.pop("method")
    return tree


def _env_overrides(tree: dict[str, Any]) -> dict[str, object]:
    """Let ``MQTTFL_METHOD__TAU=0.7`` reach the [method] table."""
    for name, raw in os.environ.items():
        if name.startswith("MQTTFL_METHOD__"):
            key = name[len("MQTTFL_METHOD__") :].lower()
            _, value = parse_override(f"{key}={raw}")
            tree.setdefault("method_params", {})[key] = value
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a run config; raise :class:`ConfigError` naming the bad key or file."""
    tree: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError("config", f"file not found: {file}")
        try:
            tree = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("config", f"{file} is not valid TOML: {exc}") from None
    tree = _env_overrides(_rename_method_table(tree))
    set_tree: dict[str, Any] = {}
    for item in overrides or []:
        keys, value = parse_override(item)
        if keys == ["broker", "password"]:  # --set lands in `ps` and shell history
            raise ConfigError(
                "broker.password",
                "never on the command line: put it in the config file "
                "or in MQTTFL_BROKER__PASSWORD",
            )
        if keys[0] == "method" and len(keys) > 1:
            keys = ["method_params", *keys[1:]]
        _set_path(set_tree, keys, value)
    token = _FILE_TREE.set(tree)
    try:
        return RunConfig(**set_tree)
    except ValidationError as exc:
        raise _config_error(exc) from None
    finally:
        _FILE_TREE.reset(token)


def _config_error(exc: ValidationError) -> ConfigError:
    first = exc.errors()[0]
    key = ""
    for part in first["loc"]:
        if isinstance(part, int):  # a list item: model.per_client[1]
            key += f"[{part}]"
        else:
            key += ("." if key else "") + ("method" if part == "method_params" else str(part))
    key = key or "config"
    if first["type"] == "extra_forbidden":
        return ConfigError(key, "unknown key")
    if first["type"] == "value_error":  # our own validators: their message, without a prefix
        return ConfigError(key, str(first["ctx"]["error"]))
    return ConfigError(key, first["msg"])


def config_from_tree(tree: dict[str, Any], source: str) -> RunConfig:
    """A config from a resolved tree (a run manifest's), nothing else read: ConfigError
    naming ``source`` and the key if it does not validate."""
    token = _FILE_TREE.set({})
    try:
        return RunConfig(**tree)
    except ValidationError as exc:
        error = _config_error(exc)
        raise ConfigError(error.key, f"{source}: {str(error).partition(': ')[2]}") from None
    finally:
        _FILE_TREE.reset(token)


def validate_method_params(model: type[BaseModel], params: dict[str, Any]) -> Any:
    """Validate the [method] table with an algorithm's own parameter model."""
    try:
        return model(**params)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(["method", *(str(p) for p in first["loc"])])
        if first["type"] == "extra_forbidden":
            raise ConfigError(key, "unknown key") from None
        raise ConfigError(key, first["msg"]) from None
