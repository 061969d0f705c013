"""What the broker refuses, in words a person can act on.

MQTT 5 brokers say why: a CONNACK reason code for a refused login, a PUBACK reason code
for a refused publish (Mosquitto 2 answers a publish its ACL denies with 0x87 "not
authorized"; it grants any subscription and filters on delivery), a DISCONNECT reason
code when another connection takes the session over. Each becomes one
:class:`Refused` line that names the user, the topic and where credentials come from.
"""

from __future__ import annotations

from typing import Any

from mqttfl.errors import BrokerError

# CONNACK: MQTT 5 reason codes, and the MQTT 3.1.1 return codes paho reports as such.
LOGIN_REFUSALS = {
    2: "client identifier rejected",
    4: "bad user name or password",
    5: "not authorized",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x8A: "banned",
    0x8C: "bad authentication method",
}
UNSUPPORTED_PROTOCOL = (1, 0x84)  # the broker does not speak MQTT 5
SESSION_TAKEN_OVER = 0x8E
KEEPALIVE_TIMEOUT = 0x8D  # paho closed a connection that stayed quiet (a CONNACK too late)


class Refused(BrokerError):
    """The broker refused this identity something it needs (a login, a publish); retrying
    cannot help, so the process stops with this line."""


def reason_value(rc: Any) -> int | None:
    """The numeric reason code of an aiomqtt error's ``rc`` (a paho ReasonCode or an int)."""
    value = getattr(rc, "value", rc)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def describe(rc: Any) -> str:
    value = reason_value(rc)
    words = LOGIN_REFUSALS.get(value, str(rc).lower()) if value is not None else str(rc)
    return f"{words} (MQTT reason code {value})" if value is not None else words


def user_text(username: str | None) -> str:
    return f"user {username!r}" if username else "an anonymous login (no user name)"


def login_refused(broker: str, username: str | None, rc: Any, origin: str) -> Refused:
    where = f"; {origin}" if origin else ""
    return Refused(f"the broker {broker} refused {user_text(username)}: {describe(rc)}{where}")


# What a refused publish most likely means for a training device; a sensing device's
# bus says what it means for a sensor (:mod:`mqttfl.sensing.identity`).
CLIENT_HINT = (
    "a device's --id, its credentials/<id>.env and the ACL's run id (broker init --run-id) "
    "must agree"
)


def publish_refused(
    who: str, username: str | None, topic: str, rc: Any, hint: str = CLIENT_HINT
) -> Refused:
    return Refused(
        f"{who} ({user_text(username)}) may not publish to {topic}: the broker refused it, "
        f"{describe(rc)}; {hint}"
    )


def taken_over(who: str, identifier: str) -> Refused:
    return Refused(
        f"{who}: another process connected with the same MQTT client id {identifier!r} "
        "and took the session over; one process per id (is it already running elsewhere?)"
    )
