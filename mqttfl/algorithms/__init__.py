"""Registry of federated methods, keyed by the config's ``method`` name."""

from __future__ import annotations

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
    return Context(
        num_classes=config.model.num_classes,
        embed_dim=config.model.embed_dim,
        rounds=config.rounds,
        seed=config.seed,
        params=validate_method_params(
            algorithm.params, _own_params(algorithm, config.method_params)
        ),
    )


def check_models(config: Any) -> None:
    """ConfigError naming ``model.name`` (or ``model.per_client``) when a client would be
    given a model its method cannot train, before any process starts."""
    required = get_algorithm(config.method).required_model
    if required is None:
        return
    key = "model.per_client" if config.model.per_client else "model.name"
    for client_id in range(config.federation.num_clients):
        arch = config.model.arch_for(client_id)
        if arch != required:
            raise ConfigError(
                key,
                f"{config.method} needs model {required!r}, but client {client_id} would run "
                f"{arch!r}; add --set model.name={required}",
            )


def own_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The entries of a ``[method]`` table that ``method`` reads (see :func:`_own_params`)."""
    return _own_params(get_algorithm(method), params)


def _own_params(algorithm: Algorithm, params: dict[str, Any]) -> dict[str, Any]:
    """Drop keys that belong to another registered method, so one config can be run with
    ``--set method=fedavg``; a key no method knows still fails as unknown."""
    own = set(algorithm.params.model_fields)
    others = {key for alg in _REGISTRY.values() for key in alg.params.model_fields} - own
    return {key: value for key, value in params.items() if key not in others}


def _register_modules(*modules: ModuleType) -> None:
    for module in modules:
        for algorithm in module.ALGORITHMS:
            register(algorithm)


from mqttfl.algorithms import (  # noqa: E402
    fedali,
    fedapa,
    fedapa_session,
    fedavg,
    fedcaring,
    fedpam,
    fedproto,
    fedsap,
    local,
    wifed,
)

_register_modules(
    fedapa, fedapa_session, fedavg, local, fedproto, fedsap, fedali, fedpam, wifed, fedcaring
)

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
