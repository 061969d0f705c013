#!/usr/bin/env bash
# The client and the sensor on linux aarch64, emulated: a Debian bookworm arm64 root
# (debootstrap) run under qemu-user-static, where this checkout's wheel is installed as
# each role installs it (the base package; torch's aarch64 CPU wheel, then [train]). One
# client there and one on this host train a federation whose coordinator and Mosquitto
# run on this host; the arm64 client's model is exported there and scored by `sense`.
# Each step's outcome, time and sizes go to a JSON file, and a summary to the console.
#
#   bash scripts/check-arm64.sh [--dir DIR] [--out FILE] [--reuse-venvs]
#
# Root, Linux with binfmt_misc, Debian's apt for the host tools, deb.debian.org and PyPI.
# The root is kept (DIR/root) and reused by the next run; the venvs in it are made anew,
# or with --reuse-venvs kept from the last run, with only this checkout's wheel installed
# again. Times under emulation are not device times.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${MQTTFL_ARM64_DIR:-/var/tmp/mqttfl-arm64}"
OUT="$REPO/benchmarks/results/arm64.json"
REUSE_VENVS=0
MIRROR="${MQTTFL_ARM64_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# PyPI's torch for linux aarch64: 2.9.1's is a CPU build (2.13.0's pulls NVIDIA's CUDA wheels).
TORCH="torch==2.9.1"
RUN_ID="arm64-check"
ROUNDS=3
# The default job, small: a middle model on 24-step ESP32 windows, 3 rounds; deadlines
# long enough for a client under emulation (minutes to import torch).
RUN_SETTINGS=(
    "run_id=$RUN_ID" "rounds=$ROUNDS" method.warmup_rounds=1
    federation.num_clients=2 federation.min_clients=2
    federation.join_timeout_s=1800 federation.round_timeout_s=1800
    federation.ack_timeout_s=600 federation.final_metrics_timeout_s=600
    model.name=middle data.window=24 data.samples_per_client=60 data.device=esp32
)

usage() {
    sed -n '9,14p' "$0" | sed 's/^# \{0,1\}//'
}
refuse() {
    echo "check-arm64: $1 (usage: bash scripts/check-arm64.sh [--dir DIR] [--out FILE] [--reuse-venvs])" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --dir | --out) [ $# -ge 2 ] || refuse "$1 needs a path" ;;&
        --dir) DIR=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --reuse-venvs) REUSE_VENVS=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) refuse "unknown option '$1'" ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then
    echo "check-arm64: needs root (debootstrap, chroot, mount)" >&2
    exit 2
fi
if [ ! -x "$REPO/.venv/bin/mqttfl" ]; then
    echo "check-arm64: no $REPO/.venv: run bash scripts/setup.sh first" >&2
    exit 2
fi

ROOT="$DIR/root"         # the arm64 root, kept between runs
HOST="$DIR/host"         # the host's side of a run: wheel, broker, coordinator, host client
LOGS="$DIR/logs"         # one log per step
GUEST=/srv/mqttfl        # inside the root: the wheel, the device's state, logs and export
STEPS="$DIR/steps.tsv"   # name, ok|failed|skipped, seconds, note
FACTS="$DIR/facts.tsv"   # key, value
# DIR is this script's: a folder that holds something else is refused, not cleared
if [ -d "$DIR" ] && [ ! -e "$DIR/.mqttfl-check-arm64" ] && [ -n "$(ls -A "$DIR")" ]; then
    echo "check-arm64: $DIR holds files this script did not make: give another --dir" >&2
    exit 2
fi
mkdir -p "$DIR"
touch "$DIR/.mqttfl-check-arm64"
rm -rf "$HOST" "$LOGS"
mkdir -p "$HOST/pids" "$LOGS"
: >"$STEPS"
: >"$FACTS"

fact() { printf '%s\t%s\n' "$1" "$2" >>"$FACTS"; }

status_of() { awk -F'\t' -v n="$1" '$1 == n { s = $2 } END { print s }' "$STEPS"; }

# step NAME NEEDS COMMAND...: run COMMAND (a function of this file, with errexit) with its
# output in LOGS/NAME.log, and record ok or failed and the seconds it took; skipped when a
# step named in NEEDS (space-separated) did not succeed.
step() {
    local name=$1 needs=$2 need rc=0 start seconds
    shift 2
    for need in $needs; do
        if [ "$(status_of "$need")" != ok ]; then
            printf '%s\tskipped\t\t%s\n' "$name" "$need did not succeed" >>"$STEPS"
            echo "check-arm64: $name skipped ($need did not succeed)" >&2
            return 0
        fi
    done
    echo "check-arm64: $name ..." >&2
    start=$(date +%s.%N)
    # In the background, so that errexit holds inside the function (it is off in `||`).
    "$@" >"$LOGS/$name.log" 2>&1 &
    wait $! || rc=$?
    seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ "$rc" -eq 0 ]; then
        printf '%s\tok\t%s\t\n' "$name" "$seconds" >>"$STEPS"
        echo "check-arm64: $name ok ($seconds s)" >&2
    else
        printf '%s\tfailed\t%s\t%s\n' "$name" "$seconds" "exit $rc: $(tail -n 1 "$LOGS/$name.log" | tr '\t' ' ' | cut -c1-300)" >>"$STEPS"
        echo "check-arm64: $name FAILED after $seconds s (exit $rc), see $LOGS/$name.log:" >&2
        tail -n 5 "$LOGS/$name.log" | sed 's/^/    /' >&2
    fi
}

# in_root [VAR=VALUE...] COMMAND...: run COMMAND in the arm64 root, from GUEST, with a clean
# environment. pip there reads Debian's CA bundle, which holds the host's local CAs too.
IN_ROOT=(/usr/bin/env -i -C "$GUEST" HOME=/root LANG=C.UTF-8 TMPDIR=/tmp
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1
    PIP_DEFAULT_TIMEOUT=180 PIP_NO_INPUT=1)
in_root() { chroot "$ROOT" "${IN_ROOT[@]}" "$@"; }

mounted_under() { awk -v r="$ROOT/" 'index($2, r) == 1 { print $2 }' /proc/mounts; }

host_tools() {
    local missing=() tool
    for tool in debootstrap:debootstrap qemu-aarch64-static:qemu-user-static update-binfmts:binfmt-support; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    fi
    if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --import qemu-aarch64
    update-binfmts --enable qemu-aarch64
    cat /proc/sys/fs/binfmt_misc/qemu-aarch64
    grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64
    fact qemu "$(qemu-aarch64-static --version | head -n 1)"
    fact debootstrap "$(dpkg-query -W -f '${Version}' debootstrap)"
}

build_root() {
    if [ -f "$ROOT/.mqttfl-root-ready" ]; then
        echo "reusing the root at $ROOT"
        fact root_reused true
    else
        fact root_reused false
        if [ -e "$ROOT" ]; then
            # a root this script began and did not finish: made again, never anything else
            [ -f "$ROOT/.mqttfl-root-started" ] || { echo "$ROOT is not a root this script made; remove it or give --dir" >&2; return 1; }
            [ -z "$(mounted_under)" ] || { echo "still mounted under $ROOT: $(mounted_under)" >&2; return 1; }
            rm -rf "$ROOT"
        fi
        mkdir -p "$ROOT"
        touch "$ROOT/.mqttfl-root-started"
        debootstrap --arch=arm64 --foreign --variant=minbase \
            --include=python3,python3-venv,python3-pip,ca-certificates \
            "$SUITE" "$ROOT" "$MIRROR"
        # without binfmt's F flag the kernel looks for the interpreter inside the root
        if ! grep -q '^flags:.*F' /proc/sys/fs/binfmt_misc/qemu-aarch64; then
            local interpreter
            interpreter=$(awk '/^interpreter/ { print $2 }' /proc/sys/fs/binfmt_misc/qemu-aarch64)
            install -D "$interpreter" "$ROOT$interpreter"
        fi
        chroot "$ROOT" /debootstrap/debootstrap --second-stage
        touch "$ROOT/.mqttfl-root-ready"
    fi
    mount_root
    mkdir -p "$ROOT$GUEST"
    cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
    # the CAs the host trusts besides Debian's (pip of the host uses them too)
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null \
        && ! diff -rq /usr/local/share/ca-certificates "$ROOT/usr/local/share/ca-certificates" >/dev/null 2>&1; then
        cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
        in_root update-ca-certificates
    fi
    fact uname_m "$(in_root uname -m)"
    fact python "$(in_root python3 -c 'import platform; print(platform.python_version())')"
    fact debian "$(cat "$ROOT/etc/debian_version")"
    [ "$(in_root uname -m)" = aarch64 ]
}

mount_root() {
    local target cpu
    [ -z "$(mounted_under)" ] || return 0
    mount -t proc proc "$ROOT/proc"
    for target in dev sys; do
        mount --rbind "/$target" "$ROOT/$target"
        mount --make-rslave "$ROOT/$target" # unmounting it later does not reach the host's
    done
    # qemu-user 7.2 shows the guest the host's /proc/cpuinfo; onnxruntime's CPU probe cannot
    # parse an x86 one and crashes at import (SIGSEGV). An arm64 one: the host's CPUs as
    # Cortex-A72s (a Raspberry Pi 4's).
    for cpu in $(seq 0 $(($(nproc --all) - 1))); do
        printf 'processor\t: %s\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n' "$cpu"
        printf 'CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\n'
        printf 'CPU revision\t: 3\n\n'
    done >"$DIR/cpuinfo"
    mount --bind "$DIR/cpuinfo" "$ROOT/proc/cpuinfo"
}

cleanup() {
    local pidfile pid mount
    for pidfile in "$HOST"/pids/*.pid; do
        [ -e "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
    done
    sleep 1
    for mount in $(mounted_under | sort -r); do
        umount -R "$mount" 2>/dev/null || umount -l "$mount" 2>/dev/null || true
    done
}
trap cleanup EXIT

build_wheel() {
    # from a copy of the package's files, so that the checkout gets no build/ folder
    mkdir -p "$HOST/source" "$HOST/wheel"
    cp "$REPO/pyproject.toml" "$REPO/README.md" "$HOST/source/"
    tar -C "$REPO" --exclude=__pycache__ --exclude='*.pyc' -cf - mqttfl | tar -C "$HOST/source" -xf -
    "$REPO/.venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$HOST/wheel" "$HOST/source"
    rm -rf "${ROOT:?}$GUEST/wheel"
    cp -r "$HOST/wheel" "$ROOT$GUEST/wheel"
    ls "$HOST/wheel"
}

wheel_in_root() { echo "$GUEST/wheel/$(basename "$HOST"/wheel/mqttfl-*.whl)"; }

venv_size() {  # ROLE VENV: its size as du -sh says it, and in MB
    fact "${1}_venv_du" "$(du -sh "$ROOT$2" | cut -f1)"
    fact "${1}_venv_mb" "$(du -sk "$ROOT$2" | awk '{ printf "%.1f", $1 / 1024 }')"
}

timed() {  # KEY COMMAND...: run COMMAND, its seconds as fact KEY_s
    local key=$1 start
    shift
    start=$(date +%s.%N)
    "$@"
    fact "${key}_s" "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
}

# reusable VENV: --reuse-venvs, and a previous run installed VENV to the end
reusable() { [ "$REUSE_VENVS" -eq 1 ] && [ -f "$ROOT$1/.mqttfl-complete" ]; }

base_install() {
    local venv=/opt/mqttfl-base
    if reusable "$venv"; then
        fact base_venv_reused true
        in_root "$venv/bin/pip" install --no-deps --force-reinstall "$(wheel_in_root)"
    else
        fact base_venv_reused false
        rm -rf "${ROOT:?}$venv"
        in_root python3 -m venv "$venv"
        in_root "$venv/bin/pip" install "$(wheel_in_root)"
        touch "$ROOT$venv/.mqttfl-complete"
    fi
    venv_size base "$venv"
    in_root /opt/mqttfl-base/bin/pip list --format freeze | tee "$LOGS/base-packages.txt"
    if in_root /opt/mqttfl-base/bin/python -c 'import torch' 2>/dev/null; then
        echo "torch is importable in the base venv" >&2
        return 1
    fi
}

base_help() {
    timed base_help in_root /opt/mqttfl-base/bin/mqttfl --help
}

base_sense_help() {
    timed base_sense_help in_root /opt/mqttfl-base/bin/mqttfl sense --help
}

train_install() {
    local venv=/opt/mqttfl-train
    if reusable "$venv"; then
        fact train_venv_reused true
        in_root "$venv/bin/pip" install --no-deps --force-reinstall "$(wheel_in_root)"
    else
        fact train_venv_reused false
        rm -rf "${ROOT:?}$venv"
        in_root python3 -m venv "$venv"
        # torch first: PyPI's aarch64 CPU wheel, pinned
        in_root "$venv/bin/pip" install "$TORCH" | tee "$HOST/torch-install.txt"
        fact torch_wheel "$(grep -o 'torch-[^ ]*\.whl ([^)]*)' "$HOST/torch-install.txt" | head -n 1)"
        in_root "$venv/bin/pip" install "$(wheel_in_root)[train]"
        touch "$ROOT$venv/.mqttfl-complete"
    fi
    venv_size train "$venv"
    in_root /opt/mqttfl-train/bin/pip list --format freeze | tee "$LOGS/train-packages.txt"
    if grep -i '^nvidia' "$LOGS/train-packages.txt"; then
        echo "CUDA wheels came with $TORCH" >&2
        return 1
    fi
}

train_torch() {
    local said
    said=$(timed torch_import in_root /opt/mqttfl-train/bin/python -c \
        'import platform, torch; print(torch.__version__, torch.version.cuda, platform.machine())')
    echo "$said"
    fact torch "$(echo "$said" | cut -d' ' -f1)"
    fact torch_cuda "$(echo "$said" | cut -d' ' -f2)"
    fact torch_machine "$(echo "$said" | cut -d' ' -f3)"
    [ "$(echo "$said" | cut -d' ' -f2)" = None ]
}

free_port() {
    "$REPO/.venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

broker() {
    local port
    port=$(free_port)
    cat >"$HOST/mosquitto.conf" <<EOF
listener $port 127.0.0.1
allow_anonymous true
max_packet_size 67108864
max_queued_messages 100000
persistence false
EOF
    local mosquitto
    mosquitto=$(command -v mosquitto || echo /usr/sbin/mosquitto)
    "$mosquitto" -c "$HOST/mosquitto.conf" >"$LOGS/mosquitto.out" 2>&1 &
    echo $! >"$HOST/pids/mosquitto.pid"
    echo "mqtt://127.0.0.1:$port" >"$HOST/broker-url"
    local tries
    for tries in $(seq 50); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "mosquitto on 127.0.0.1:$port (after $tries tries)"
            return 0
        fi
        sleep 0.2
    done
    return 1
}

federation() {
    local url sets=() item coordinator arm64 host pid rounds coordinator_rc=0 arm64_rc=0 host_rc=0
    url=$(cat "$HOST/broker-url")
    for item in "${RUN_SETTINGS[@]}"; do sets+=(--set "$item"); done
    rm -rf "${ROOT:?}$GUEST/state" "${ROOT:?}$GUEST/logs"
    "$REPO/.venv/bin/mqttfl" coordinator --config "$REPO/configs/fedapa-csi.toml" "${sets[@]}" \
        --broker "$url" --out "$HOST/run" >"$LOGS/coordinator.out" 2>&1 &
    coordinator=$!
    echo "$coordinator" >"$HOST/pids/coordinator.pid"
    # the devices need only the run id and the broker: the run's settings come with its manifest
    (cd "$HOST" && MQTTFL_LOG_DIR="$HOST/logs" exec "$REPO/.venv/bin/mqttfl" client \
        --run "$RUN_ID" --id 1 --broker "$url" --state-dir "$HOST/state") >"$LOGS/client-host.out" 2>&1 &
    host=$!
    echo "$host" >"$HOST/pids/client-host.pid"
    fact arm64_client_started "$(date +%s.%N)"
    (exec chroot "$ROOT" "${IN_ROOT[@]}" MQTTFL_LOG_DIR="$GUEST/logs" /opt/mqttfl-train/bin/mqttfl \
        client --run "$RUN_ID" --id 0 --broker "$url" --state-dir "$GUEST/state") >"$LOGS/client-arm64.out" 2>&1 &
    arm64=$!
    echo "$arm64" >"$HOST/pids/client-arm64.pid"
    # each process ends with the run; one that outlives the arm64 client by 2 minutes is stopped
    wait "$arm64" || arm64_rc=$?
    for pid in "$coordinator" "$host"; do
        for _ in $(seq 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill "$pid" 2>/dev/null || true
    done
    wait "$coordinator" || coordinator_rc=$?
    wait "$host" || host_rc=$?
    tail -n 30 "$LOGS/coordinator.out"
    rounds=$("$REPO/.venv/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["rounds_completed"])' \
        "$HOST/run/summary.json" 2>/dev/null || echo 0)
    fact coordinator_exit "$coordinator_rc"
    fact arm64_client_exit "$arm64_rc"
    fact host_client_exit "$host_rc"
    fact rounds_completed "$rounds"
    echo "coordinator exit $coordinator_rc, arm64 client exit $arm64_rc, host client exit $host_rc, $rounds of $ROUNDS rounds"
    [ "$coordinator_rc" -eq 0 ] && [ "$arm64_rc" -eq 0 ] && [ "$host_rc" -eq 0 ] && [ "$rounds" -eq "$ROUNDS" ]
}

export_model() {
    rm -rf "${ROOT:?}$GUEST/export"
    in_root /opt/mqttfl-train/bin/mqttfl export --state-dir "$GUEST/state" --run "$RUN_ID" \
        --client 0 --out "$GUEST/export" --with-shard
    ls -la "$ROOT$GUEST/export"
    fact export_kb "$(du -sk "$ROOT$GUEST/export" | cut -f1)"
}

sense_eval() {
    in_root /opt/mqttfl-base/bin/mqttfl sense "$GUEST/export" --input "shard:$GUEST/export/shard" --eval \
        | tee "$HOST/sense-eval.txt"
    fact sense_eval "$(tr -s ' \n' ' ' <"$HOST/sense-eval.txt" | sed 's/^ //; s/ $//')"
}

sense_publish() {
    in_root /opt/mqttfl-base/bin/mqttfl sense "$GUEST/export" --input "shard:$GUEST/export/shard" \
        --broker "$(cat "$HOST/broker-url")" --json --readings 3 | tee "$HOST/sense-readings.jsonl"
    [ "$(wc -l <"$HOST/sense-readings.jsonl")" -eq 3 ]
}

started=$(date +%s.%N)
step host_tools "" host_tools
step root host_tools build_root
step wheel root build_wheel
step base_install wheel base_install
step base_help base_install base_help
step base_sense_help base_install base_sense_help
step train_install wheel train_install
step torch_import train_install train_torch
step broker "" broker
step federation "train_install broker" federation
step export federation export_model
step sense_eval "export base_install" sense_eval
step sense_publish "export base_install broker" sense_publish
total=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

mkdir -p "$(dirname "$OUT")"
cd "$REPO"
.venv/bin/python - "$STEPS" "$FACTS" "$OUT" "$total" "$ROOT" "$TORCH" "${RUN_SETTINGS[*]}" \
    "$ROOT$GUEST/logs/client-0.jsonl" <<'PY'
import json
import statistics
import sys
from datetime import datetime

from benchmarks.common import machine, now_utc

steps_path, facts_path, out, total, root, torch_pin, settings, client_log = sys.argv[1:]
facts = dict(line.rstrip("\n").split("\t", 1) for line in open(facts_path) if "\t" in line)


def client_figures() -> dict[str, float | None]:
    """The arm64 client's own log: start to joining the run, training seconds a round, RSS."""
    try:
        lines = open(client_log).read().splitlines()
    except OSError:
        return {}
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    started = float(facts.get("arm64_client_started", "nan"))
    joined = [e for e in events if e.get("event") == "run.joined"]
    uploads = [e for e in events if e.get("event") == "upload.sent"]
    at = datetime.fromisoformat(joined[0]["timestamp"]).timestamp() if joined else None
    return {
        "start_to_joined_s": round(at - started, 1) if at is not None else None,
        "uploads": len(uploads),
        "training_s_per_round": round(statistics.median(e["seconds"] for e in uploads), 2)
        if uploads else None,
        # under qemu-user: the emulator's memory is counted too
        "peak_rss_mb": max((e.get("peak_rss_mb", 0) for e in events), default=None),
    }


def number(key: str) -> float | int | None:
    if key not in facts:
        return None
    value = float(facts[key])
    return int(value) if value.is_integer() and "." not in facts[key] else value


steps = []
for line in open(steps_path):
    name, status, seconds, note = line.rstrip("\n").split("\t")
    steps.append({"name": name, "status": status, "ok": status == "ok",
                  "seconds": float(seconds) if seconds else None, "note": note or None})
doc = {
    "benchmark": "arm64",
    "quick": False,
    "date": now_utc(),
    "command": "bash scripts/check-arm64.sh",
    "machine": machine(),
    "what": "a Debian bookworm arm64 root under qemu-user-static: the base and [train] roles "
    "installed, one client of a federation whose coordinator runs on the host, `sense` on "
    "that client's exported model; times under emulation are not device times",
    "ok": all(s["ok"] for s in steps),
    "total_s": float(total),
    "root": {"path": root, "reused": facts.get("root_reused") == "true",
             "uname_m": facts.get("uname_m"), "debian": facts.get("debian"),
             "python": facts.get("python")},
    "emulator": {"qemu": facts.get("qemu"), "debootstrap": facts.get("debootstrap")},
    "torch": {"pin": torch_pin, "wheel": facts.get("torch_wheel"), "version": facts.get("torch"), "cuda": facts.get("torch_cuda"),
              "machine": facts.get("torch_machine"), "import_s": number("torch_import_s")},
    "venvs_reused": {"base": facts.get("base_venv_reused") == "true",
                     "train": facts.get("train_venv_reused") == "true"},
    "sizes": {"base_venv": facts.get("base_venv_du"), "base_venv_mb": number("base_venv_mb"),
              "train_venv": facts.get("train_venv_du"), "train_venv_mb": number("train_venv_mb"),
              "export_kb": number("export_kb")},
    "help_s": {"mqttfl --help": number("base_help_s"),
               "mqttfl sense --help": number("base_sense_help_s")},
    "federation": {"settings": settings.split(), "rounds_completed": number("rounds_completed"),
                   "coordinator_exit": number("coordinator_exit"),
                   "arm64_client_exit": number("arm64_client_exit"),
                   "host_client_exit": number("host_client_exit"),
                   "arm64_client": client_figures()},
    "sense_eval": facts.get("sense_eval"),
    "steps": steps,
}
with open(out, "w") as handle:
    handle.write(json.dumps(doc, indent=2) + "\n")
width = max(len(s["name"]) for s in steps)
print(f"arm64 under qemu ({doc['root']['uname_m']}, Debian {doc['root']['debian']}, "
      f"Python {doc['root']['python']}, torch {doc['torch']['version']}): "
      f"{'every step worked' if doc['ok'] else 'some steps did not work'}, {float(total):.0f} s")
for s in steps:
    seconds = f"{s['seconds']:8.1f} s" if s["seconds"] is not None else " " * 10
    print(f"  {s['name']:<{width}}  {s['status']:<7} {seconds}  {s['note'] or ''}")
sizes, client = doc["sizes"], doc["federation"]["arm64_client"]
print(f"  venvs: base {sizes['base_venv']}, train {sizes['train_venv']}"
      f"{' (reused)' if any(doc['venvs_reused'].values()) else ''}; torch import "
      f"{doc['torch']['import_s']} s; arm64 client: joined {client.get('start_to_joined_s')} s "
      f"after its start, trained {client.get('training_s_per_round')} s a round")
print(f"  result: {out}")
PY
[ "$(awk -F'\t' '$2 != "ok"' "$STEPS" | wc -l)" -eq 0 ]
