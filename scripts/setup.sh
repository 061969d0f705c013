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
# torch first, as a CPU build: PyPI's Linux wheel is a CUDA build that pulls several GB of
# NVIDIA wheels. PyTorch's CPU index where it can be reached (a user's machine); else the
# plain pin, whose CPU wheel lies on disk where that index cannot be reached (CI).
CPU_INDEX="${MQTTFL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
pin() {
    echo "setup: torch==2.13.0 from the configured index (PyTorch's CPU index: $1)" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
}
if ! .venv/bin/python - "$CPU_INDEX" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=8).close()
PY
then
    pin "out of reach"
elif .venv/bin/python -m pip install -q --disable-pip-version-check \
        --index-url "$CPU_INDEX" "torch>=2.3"; then
    echo "setup: torch from PyTorch's CPU index ($CPU_INDEX)" >&2
else
    pin "its install failed"
fi
# Then the package with every role's extra (a checkout is every role), the test tools and
# the documentation site's.
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[train,capture,test,images,docs]"
echo "setup: ready (.venv)" >&2
