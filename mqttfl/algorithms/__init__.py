"""Registry of federated methods, keyed by the config's ``method`` name."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from mqttfl.algorithms.base import (
    Algorithm,
    ClientSide,
    Context,
    Downlinks,
    ServerSide,
    Upload,
)
from mqttfl.errors import ConfigError
from mqttfl.privacy.accountant import privacy_settings
from mqttfl.wire.schemas import ClientInfo

_REGISTRY: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    if algorithm.name in _REGISTRY:
        raise ValueError(f"method {algorithm.name!r} registered twice")
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def algorithm_names() -> list[str]:
    return sorted(_REGISTRY)


def get_algorithm(name: str) -> Algorithm:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            "method", f"unknown method {name!r}; known: {', '.join(algorithm_names())}"
        ) from None


def make_context(config: Any) -> Context:
    """Build the shared :class:`Context` from a RunConfig, validating ``[method]``."""
    from mqttfl.config import validate_method_params

    algorithm = get_algorithm(config.method)
    if config.privacy.enabled and not algorithm.client.supports_privacy:
        raise ConfigError(
            "privacy.enabled",
            f"{config.method} has no differentially private upload; methods that have one: "
            + ", ".join(n for n in algorithm_names() if _REGISTRY[n].client.supports_privacy),
        )
    return Context(
        num_classes=config.model.num_classes,
        embed_dim=config.model.embed_dim,
        rounds=config.rounds,
        seed=config.seed,
        params=validate_method_params(
            algorithm.params, _own_params(algorithm, config.method_params)
        ),
        privacy=privacy_settings(config),
    )


def check_models(config: Any) -> None:
    """ConfigError naming ``model.name`` (or ``model.per_client``) when a client would be
    given a model its method cannot train, before any process starts."""
    required = get_algorithm(config.method).required_model
    if required is None:
        return
    key = "model.per_client" if config.model.per_client else "model.name"
    for index in range(config.federation.num_clients):
        client_id = str(index)  # the ids `mqttfl run` gives its clients
        arch = config.model.arch_of(client_id)
        if arch != required:
            raise ConfigError(
                key,
                f"{config.method} needs model {required!r}, but client {client_id} would run "
                f"{arch!r}; add --set model.name={required}",
            )


def own_params(method: str, params: Mapping[str, object]) -> dict[str, object]:
    """The entries of a ``[method]`` table that ``method`` reads (see :func:`_own_params`)."""
    return _own_params(get_algorithm(method), params)


#: In ``[method]``: the methods whose keys a config shared by several methods holds.
SHARED_WITH = "shared_with"


def _own_params(algorithm: Algorithm, params: Mapping[str, object]) -> dict[str, object]:
    """The keys of ``[method]`` that ``algorithm`` reads.

    A key of another method is an error naming it, unless the table says it serves that
    method too (``shared_with = ["fedapa", "fedali"]``, beside the keys: one config file
    that `mqttfl compare` runs with several methods); such a key is left out here. A key
    no method knows fails as unknown when the method validates its table.
    """
    shared = params.get(SHARED_WITH, [])
    if not isinstance(shared, list) or not all(isinstance(m, str) for m in shared):
        raise ConfigError(f"method.{SHARED_WITH}", "must be a list of method names")
    unknown = sorted(set(shared) - set(_REGISTRY))
    if unknown:
        raise ConfigError(
            f"method.{SHARED_WITH}",
            f"unknown methods {unknown}; known: {', '.join(algorithm_names())}",
        )
    own = set(algorithm.params.model_fields)
    kept = {}
    for key, value in params.items():
        if key == SHARED_WITH:
            continue
        owners = [a.name for a in _REGISTRY.values() if key in a.params.model_fields]
        if key in own or not owners:
            kept[key] = value
        elif not set(owners) & set(shared):
            raise ConfigError(
                f"method.{key}",
                f"a key of {', '.join(owners)}, not of {algorithm.name}; a config shared by "
                f"several methods lists them in method.{SHARED_WITH}",
            )
    return kept


def _register_modules(*modules: ModuleType) -> None:
    for module in modules:
        for algorithm in module.ALGORITHMS:
            register(algorithm)


from mqttfl.algorithms import (  # noqa: E402
    fedali,
    fedapa,
    fedavg,
    fedcaring,
    fedpam,
    fedproto,
    fedsap,
    local,
    wifed,
)

_register_modules(fedapa, fedavg, local, fedproto, fedsap, fedali, fedpam, wifed, fedcaring)

__all__ = [
    "Algorithm",
    "ClientInfo",
    "ClientSide",
    "Context",
    "Downlinks",
    "ServerSide",
    "Upload",
    "algorithm_names",
    "get_algorithm",
    "make_context",
    "register",
]
