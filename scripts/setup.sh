#!/usr/bin/env bash
# Set up mqttfl on a fresh Debian machine: Mosquitto (apt), a venv, torch (CPU), the package.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

need_apt=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
command -v mosquitto_pub >/dev/null 2>&1 || need_apt+=(mosquitto-clients)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need_apt+=(python3-venv)
# The tests skew a client's wall clock with libfaketime (a device without RTC or NTP).
command -v faketime >/dev/null 2>&1 || need_apt+=(faketime)
# They look at `mqttfl watch` on a real terminal inside tmux.
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]} with apt-get" >&2
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first, pinned: the CPU wheel; a bare range would pull the CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
# Then the package with every role's extra (a checkout is every role) and the test tools.
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[train,capture,test,images]"
echo "setup: ready (.venv)" >&2
