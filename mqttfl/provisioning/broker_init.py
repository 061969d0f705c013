"""`mqttfl broker init`: the files of a locked-down Mosquitto for one deployment.

Written into ``--out``::

    mosquitto.conf         no anonymous access, password file, ACL, packet size limit
    passwd                 salted hashes made by mosquitto_passwd (plain text never stays)
    acl                    per identity: the topics it may publish and subscribe to
    credentials/<id>.env   MQTTFL_BROKER__USERNAME / __PASSWORD (and __TLS_CA) for one
                           identity, mode 0600: ``set -a; . credentials/0.env; set +a``
                           (``watch.env``, ``watch-NAME.env``: read-only identities of
                           `mqttfl watch`; ``sensor-NAME.env`` and ``gateway-NAME.env``:
                           a sensing device and its gateway, :mod:`.sensors`)
    tls/                   with ``--tls``: a local CA (openssl) and the broker's certificate

The ACL mirrors :mod:`mqttfl.wire.topics`. A client may publish only its own uplink,
metrics and status, and subscribe only to the run's start/state/broadcast topics and
its own downlink; the coordinator has its own identity with the run's rounds, state,
statuses and lease (the only identity that may write the lease), and reads the sites'
notices, which only each site's bridge identity may write; ``watch`` (and each
``--watchers`` identity) may read the whole run but publish nothing; a sensor may
publish only its own readings (:mod:`.sensors`). Credentials reach mqttfl through the
config file or the environment, never the command line.

What Mosquitto can bound per client is written into mosquitto.conf: the size of a
message (``max_packet_size``), the QoS 1 messages a client may have in flight towards
the broker (``max_inflight_messages``, sent to MQTT 5 clients as Receive Maximum), the
messages queued for a slow or absent subscriber (``max_queued_messages``) and the
keep-alive a client may ask for (``max_keepalive``: a vanished device's last will fires
within 1.5 times it). Mosquitto has no per-client publish rate limit; the coordinator
keeps one of its own (:mod:`mqttfl.engine.budget`).
"""

from __future__ import annotations

import getpass
import grp
import ipaddress
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from mqttfl.errors import BrokerError, StateError, UsageError
from mqttfl.files import write_atomic
from mqttfl.paths import first_link, link_refused, make_dir, open_nofollow
from mqttfl.provisioning.sensors import sensor_acl, sensor_identities, sensor_readers
from mqttfl.provisioning.sites import (
    EdgeBridge,
    bridge_acl,
    bridge_conf,
    bridge_identity,
)
from mqttfl.wire import BROADCAST, check_id
from mqttfl.wire.control import COORDINATOR

# As broker/mosquitto.conf: the coordinator's broadcast to 1000 clients is ~21 MB.
DEFAULT_MAX_PACKET = 64 * 1024 * 1024
TOOL_TIMEOUT_S = 60.0
# The longest keep-alive a client may ask for (MQTT 5 clients are told to use this one):
# the last will of a device that vanished fires within 1.5 times it.
MAX_KEEPALIVE_S = 120
WATCH = "watch"  # the read-only identity of `mqttfl watch`; --watchers adds watch-NAME


@dataclass(frozen=True)
class BrokerSetup:
    """What `broker init` wrote; ``passwords`` is for the caller, it is not stored in clear."""

    out: Path
    port: int
    tls: bool
    passwords: dict[str, str] = field(repr=False)
    run_as: str | None = None  # the user mosquitto drops to when started as root
    note: str = ""  # why it cannot drop root, when it cannot

    @property
    def conf(self) -> Path:
        return self.out / "mosquitto.conf"

    @property
    def ca(self) -> Path | None:
        return self.out / "tls" / "ca.crt" if self.tls else None

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://127.0.0.1:{self.port}"

    def env_file(self, identity: str) -> Path:
        return self.out / "credentials" / f"{identity}.env"

    def env(self, identity: str) -> dict[str, str]:
        """The MQTTFL_BROKER__* variables of one identity (what its .env file holds)."""
        return read_env_file(self.env_file(identity))


def client_ids(*, clients: int | None = None, ids: str | None = None) -> list[str]:
    if (clients is None) == (ids is None):
        raise UsageError("give exactly one of --clients N or --ids a,b,c")
    if clients is not None:
        names = [str(i) for i in range(clients)]
    else:
        assert ids is not None
        names = [s.strip() for s in ids.split(",")]
    if not names or (clients is not None and clients < 1):
        raise UsageError("at least one client identity is needed")
    for name in names:
        check_id(name)
        if name in (COORDINATOR, WATCH):
            raise UsageError(f"'{name}' is the {name} identity, not a client id")
    if len(set(names)) != len(names):
        raise UsageError("client ids must be unique")
    return names


def watcher_names(text: str | None) -> list[str]:
    """``--watchers ana,ben`` as identities (``watch-ana``, ``watch-ben``)."""
    if text is None:
        return []
    names = [s.strip() for s in text.split(",")]
    if len(set(names)) != len(names):
        raise UsageError(f"--watchers {text!r} names a watcher twice")
    return [f"{WATCH}-{check_id(name, '--watchers: watcher name')}" for name in names]


def acl_text(
    clients: list[str],
    run_id: str | None,
    *,
    watchers: list[str] | None = None,
    sensors: list[str] | None = None,
) -> str:
    """Mosquitto ACL: the coordinator owns the run, each client only its own topics; the
    watchers read, each sensor writes only its own readings."""
    base = f"mqttfl/{check_id(run_id, 'run id') if run_id else '+'}"
    readers = sensor_readers() if sensors else []
    lines = [
        "# Written by `mqttfl broker init`. Anonymous clients get nothing (allow_anonymous false).",
        f"user {COORDINATOR}",
        f"topic readwrite {base}/state",
        f"topic readwrite {base}/lease",
        f"topic readwrite {base}/manifest",
        f"topic readwrite {base}/probe/#",
        f"topic readwrite {base}/status/#",
        f"topic readwrite {base}/round/#",
        f"topic read {base}/site/#",  # written by each site's bridge identity only
        "topic read $SYS/#",
        "",
    ]
    for watcher in [WATCH, *(watchers or [])]:
        lines += [f"user {watcher}", f"topic read {base}/#", *readers, ""]
    for client in clients:
        lines += [
            f"user {client}",
            f"topic readwrite {base}/status/{client}",
            f"topic write {base}/round/+/ack/{client}",
            f"topic write {base}/round/+/up/{client}",
            f"topic write {base}/round/+/metrics/{client}",
            f"topic read {base}/state",
            f"topic read {base}/manifest",  # the run's settings: a device needs no config
            f"topic read {base}/lease",  # whether the run still has a live coordinator
            f"topic read {base}/round/+/start",
            f"topic read {base}/round/+/down/{BROADCAST}",
            f"topic read {base}/round/+/down/{client}",
            "",
        ]
    for sensor in sensors or []:
        lines += sensor_acl(sensor)
    return "\n".join(lines)


def conf_text(
    out: Path, *, port: int, bind: str, tls: bool, max_packet_bytes: int, user: str | None
) -> str:
    lines = [
        "# Written by `mqttfl broker init`; start with: mosquitto -c "
        + str(out / "mosquitto.conf"),
        "per_listener_settings false",
        "allow_anonymous false",
        f"password_file {out / 'passwd'}",
        f"acl_file {out / 'acl'}",
        "# A larger publish disconnects its sender (uploads are far smaller; see mqttfl's",
        "# federation.max_upload_bytes, which the coordinator enforces per upload).",
        f"max_packet_size {max_packet_bytes}",
        "# Per client: messages queued while it is slow or away (a byte bound would drop",
        "# honest uploads first during a flood), QoS 1 messages in flight (MQTT 5's Receive",
        "# Maximum: a client sending more is disconnected), the keep-alive it may ask for.",
        "max_queued_messages 100000",
        "max_queued_bytes 0",
        "max_inflight_messages 100",
        f"max_keepalive {MAX_KEEPALIVE_S}",
        "queue_qos0_messages true",
        "persistence true",
        f"persistence_location {out / 'data'}/",
        "autosave_interval 30",
        "set_tcp_nodelay true",
        "sys_interval 1",
        f"log_dest file {out / 'mosquitto.log'}",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "connection_messages true",
    ]
    if user:  # mosquitto started as root drops to this user; it must be able to read the files
        lines.append(f"user {user}")
    lines += ["", f"listener {port} {bind}"]
    if tls:
        tls_dir = out / "tls"
        lines += [
            f"cafile {tls_dir / 'ca.crt'}",
            f"certfile {tls_dir / 'server.crt'}",
            f"keyfile {tls_dir / 'server.key'}",
            "tls_version tlsv1.2",
        ]
    return "\n".join(lines) + "\n"


def _tool(name: str) -> str:
    found = shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/usr/sbin/{name}") if Path(p).exists()), None
    )
    if found is None:
        raise BrokerError(f"{name} is not installed (apt-get install mosquitto openssl)")
    return found


def _run(cmd: list[str], *, cwd: Path) -> None:
    result = subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise BrokerError(
            f"{Path(cmd[0]).name} failed ({result.returncode}): {result.stderr.strip()[-500:]}"
        )


def _write_private(path: Path, text: str) -> None:
    """A new file of mode 0600 in place of ``path`` (a link there is refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode(), sync=False, mode=0o600)


def write_password_file(path: Path, passwords: dict[str, str]) -> None:
    """Hash all identities in one mosquitto_passwd call. ``-U`` rewrites a plain file in
    place, through any link and by way of ``<file>.tmp``: it works in a private directory
    of its own, and the hashed file is then renamed to ``path``."""
    for user, password in passwords.items():
        if ":" in user or "\n" in password:
            raise UsageError(f"identity {user!r} cannot go into a password file")
    if os.path.islink(path):
        raise link_refused(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".passwd-", dir=path.parent))  # mode 0700
    try:
        plain = work / path.name
        _write_private(plain, "".join(f"{u}:{p}\n" for u, p in passwords.items()))
        _run([_tool("mosquitto_passwd"), "-U", str(plain)], cwd=work)
        os.replace(plain, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # never leave the plain text behind


def make_tls(tls_dir: Path, hostnames: list[str]) -> None:
    """A local CA and a broker certificate for ``hostnames`` (IPs go in as IP SANs)."""
    openssl = _tool("openssl")
    tls_dir.mkdir(parents=True, exist_ok=True)
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _run(
        [
            openssl,
            "req",
            "-x509",
            *curve,
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "825",
            "-subj",
            "/CN=mqttfl local CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        cwd=tls_dir,
    )
    _run(
        [
            openssl,
            "req",
            *curve,
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            f"/CN={hostnames[0]}",
        ],
        cwd=tls_dir,
    )
    sans = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hostnames)
    (tls_dir / "server.ext").write_text(
        f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    _run(
        [
            openssl,
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "825",
            "-extfile",
            "server.ext",
        ],
        cwd=tls_dir,
    )
    for name in ("ca.key", "server.key"):
        os.chmod(tls_dir / name, 0o600)
    for name in ("server.csr", "server.ext", "ca.srl"):
        (tls_dir / name).unlink(missing_ok=True)


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def init_broker(
    out: Path,
    clients: list[str],
    *,
    run_id: str | None = None,
    port: int | None = None,
    bind: str = "127.0.0.1",
    tls: bool = False,
    hostnames: list[str] | None = None,
    max_packet_bytes: int = DEFAULT_MAX_PACKET,
    force: bool = False,
    bridges: dict[str, list[str]] | None = None,
    edge: EdgeBridge | None = None,
    unprivileged: bool = False,
    sensors: list[str] | None = None,
    watchers: list[str] | None = None,
) -> BrokerSetup:
    """Write a locked-down broker. ``bridges`` (central side): a bridge identity and ACL
    per site; ``edge``: this broker is that site's edge, bridged to the central one;
    ``sensors``: an identity per sensing device and one per its gateway; ``watchers``:
    read-only identities besides ``watch`` (``watch-NAME``, from :func:`watcher_names`).
    ``unprivileged``: a mosquitto started as root drops to an unprivileged user (who
    then owns the files it needs), where that user can reach ``out``."""
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port number in 1-65535")
    if port is None:
        port = 8883 if tls else 1883
    if max_packet_bytes < 1024:
        raise UsageError("--max-packet-bytes must be at least 1024")
    out = out.resolve()
    if (out / "passwd").exists() and not force:
        raise StateError(
            f"{out} already holds a broker setup; pass --force to replace its credentials"
        )
    make_dir(out, what="--out")
    # Mosquitto and its tools write here through any link (its log, its store, passwd.tmp)
    link = first_link(out)
    if link is not None:
        raise link_refused(link)
    (out / "data").mkdir(exist_ok=True)
    bridges = bridges or {}
    for site, members in bridges.items():
        if not set(members) <= set(clients):
            raise UsageError(
                f"--bridge {site}: ids {sorted(set(members) - set(clients))} are not clients"
            )
    identities = [
        COORDINATOR,
        WATCH,
        *(watchers or []),
        *clients,
        *(bridge_identity(site) for site in bridges),
        *sensor_identities(sensors or []),
    ]
    twice = sorted(i for i, n in Counter(identities).items() if n > 1)
    if twice:
        raise UsageError(
            f"identity {twice[0]!r} would be made twice (a client id that is also a "
            "watcher's, site's or sensor's identity): rename one"
        )
    passwords = {identity: secrets.token_urlsafe(24) for identity in identities}
    write_password_file(out / "passwd", passwords)
    if tls:
        make_tls(out / "tls", hostnames or ["localhost", "127.0.0.1"])
    acl = acl_text(clients, run_id, watchers=watchers, sensors=sensors)
    for site, members in bridges.items():
        acl += "\n" + "\n".join(bridge_acl(site, members, run_id))
    _write_private(out / "acl", acl)
    # mosquitto started as root switches to the user 'mosquitto' before it reads the
    # password file and ACL; run it as the owner of these private files, or (deployments)
    # as an unprivileged user given those files.
    user = getpass.getuser() if os.geteuid() == 0 else None
    note = ""
    if user == "root" and unprivileged:
        service, note = service_user(out)
        if service is not None:
            user = service.pw_name
            _give(out, service, tls=tls)
    conf = conf_text(
        out, port=port, bind=bind, tls=tls, max_packet_bytes=max_packet_bytes, user=user
    )
    if edge is not None:  # the bridge's password is in it: private
        _write_private(
            out / "mosquitto.conf", conf + "\n".join(bridge_conf(edge, clients, run_id)) + "\n"
        )
    else:
        write_atomic(out / "mosquitto.conf", conf.encode(), sync=False)
    ca = out / "tls" / "ca.crt"
    for identity, password in passwords.items():
        lines = [f"MQTTFL_BROKER__USERNAME={identity}", f"MQTTFL_BROKER__PASSWORD={password}"]
        if tls:
            lines.append(f"MQTTFL_BROKER__TLS_CA={ca}")
        _write_private(out / "credentials" / f"{identity}.env", "\n".join(lines) + "\n")
    return BrokerSetup(out, port, tls, passwords, user, note)


def service_user(out: Path) -> tuple[pwd.struct_passwd | None, str]:
    """The unprivileged user for a mosquitto started as root ('mosquitto', else
    'nobody'), or None and why it cannot reach ``out``."""
    for name in ("mosquitto", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        groups = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if name in g.gr_mem}
        for folder in reversed(out.parents):
            info = folder.stat()
            if info.st_uid == entry.pw_uid:
                bit = stat.S_IXUSR
            elif info.st_gid in groups:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not info.st_mode & bit:
                return None, (
                    f"mosquitto started as root will keep running as root: user {name!r} "
                    f"cannot enter {folder} (mode {stat.S_IMODE(info.st_mode):o}); "
                    "an --out that other users can reach lets it drop root"
                )
        return entry, ""
    return None, "mosquitto started as root will keep running as root: no 'mosquitto' user"


def _give(out: Path, user: pwd.struct_passwd, *, tls: bool) -> None:
    """Hand mosquitto's own files to ``user`` (the credentials/ stay with their owner)."""
    log = out / "mosquitto.log"
    os.close(open_nofollow(log, os.O_WRONLY | os.O_CREAT, 0o600))
    owned = [out, out / "data", out / "passwd", out / "acl", log]
    if tls:
        owned += [out / "tls", *(out / "tls" / n for n in ("ca.crt", "server.crt", "server.key"))]
    for path in owned:
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}
