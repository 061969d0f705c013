"""ESPectre's recordings, found here or obtained at a pinned commit with their checksums.

The presence job (``configs/presence-espectre.toml``) trains on the ESPectre project's
recordings: ``micro-espectre/data`` of github.com/francescopace/espectre at
:data:`ESPECTRE_COMMIT`, under the GPLv3, so never shipped with mqttfl. They are looked
for, in order:

1. ``data.path``/espectre, when the config names a path (then only there);
2. ``$MQTTFL_SHARED_DATA``/espectre, else ``../shared/data/espectre`` beside a checkout;
3. the user's cache, ``$MQTTFL_CACHE_DIR`` (else ``$XDG_CACHE_HOME/mqttfl``, else
   ``~/.cache/mqttfl``) ``/espectre/<commit>``;

and where none holds them, they are fetched into the cache from
``$MQTTFL_ESPECTRE_MIRROR`` (a directory or an http(s) URL laid out as the repository at
that commit: ``LICENSE`` and ``micro-espectre/data/...``) or else from GitHub's raw files
at the commit. Every file is checked against its SHA-256 below before the whole folder is
moved into place in one rename, so a cache is complete or absent, never half-written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from mqttfl.errors import DataError
from mqttfl.files import one_line
from mqttfl.logs import get_logger
from mqttfl.paths import cache_root

ESPECTRE_REPOSITORY = "francescopace/espectre"
ESPECTRE_COMMIT = "3886cebda4d5723a2204498e5eb8dde274cecd57"
GITHUB_RAW = f"https://raw.githubusercontent.com/{ESPECTRE_REPOSITORY}/{ESPECTRE_COMMIT}/"
#: each file's SHA-256, by its path under micro-espectre/data (LICENSE: the repository's)
FILES: dict[str, str] = {
    "LICENSE": "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986",
    "dataset_info.json": "f34ad1f2120152937f44272388a90d7e786c691b476706522f55a34d90ec8eb1",
    "baseline/baseline_c3_64sc_20260329_130303.npz": "13d0baeaae50a0b8508f8417c615b8e4cbcd766612e5a973d9d5468d9cfcf46f",
    "baseline/baseline_c3_64sc_20260329_130411.npz": "e532ca7486740afae43bc66d7f4588f87878c1ae64e565d8d84175946bdf8071",
    "baseline/baseline_c5_64sc_20260310_233856.npz": "5bf7378e93bd268face5e3185e3175429411bf7a5bf30524eb31cafc15ab1f4a",
    "baseline/baseline_c5_64sc_20260329_124440.npz": "6f054e4df6b3c1972158e7bc3e9e923ee9a1e5f524597a12844b245f9c82bcad",
    "baseline/baseline_c6_64sc_20260310_230414.npz": "ddf4c05ab86b5484c41b7edc3fb5aa5e844238bc8b6764f3d5ac590804c29dc9",
    "baseline/baseline_c6_64sc_20260310_234819.npz": "d09a5e7dccef677207ab8d93250ba9274b0e97a42ee0ed651d6aacc4b2fae8eb",
    "baseline/baseline_esp32_64sc_20260214_183059.npz": "d5c04be9dfd18345d1cc5bb4f79ab2519857e87849efb7d81060bda5a8e2cd33",
    "baseline/baseline_esp32_64sc_20260310_232100.npz": "98249c24c12ff2e8bf350973202891f54b45b8c66f189d9e15930587e49ff670",
    "baseline/baseline_s3_64sc_20260117_222606.npz": "3c44a34cf79f3239da5942192e0909eaf413180f955128a8664cf0c3d36438d8",
    "baseline/baseline_s3_64sc_20260329_125557.npz": "7b6e0448846f9f17c205389b5bdab9907c0023f1f8dcec0ac669a6f0a4479352",
    "movement/movement_c3_64sc_20260329_130321.npz": "f336587549e89549ee3f510e4d9bdc8365cefa609516b955c86893ce1a672260",
    "movement/movement_c3_64sc_20260329_130429.npz": "18a8661f607c9216f40580531e74acf29c61bc2b20f28d400085a7e301def49d",
    "movement/movement_c5_64sc_20260310_233928.npz": "fd058b2214d2d2a37b9596919d0e136b78d8c1cc0b035f04de3972226ddd781b",
    "movement/movement_c5_64sc_20260329_124504.npz": "78ae34b7d21fc325cb40bb9a2f95521632a4f7d1d7790b3cf8ecffe424bdc11f",
    "movement/movement_c6_64sc_20260310_230434.npz": "0da38c8e31ecfaf002d60cad15df0707ae6bb4ddf42f2555a6e77a3fbb310c6e",
    "movement/movement_c6_64sc_20260310_234839.npz": "fe254a444f1722b4d23be2fa55e383af5281a61e006f7b665181d8c061f5351c",
    "movement/movement_esp32_64sc_20260214_183141.npz": "138b8d40626afc66747018f12c7f1175d874264eaacd936c1abe9293b20e6a04",
    "movement/movement_esp32_64sc_20260310_232137.npz": "147afbbde5ea5ebf59a3319b1dea06fdfffc2ad872ea5873c76c54fa2bd33a87",
    "movement/movement_s3_64sc_20260117_222626.npz": "39711829fc8e5dc07ee8695eb5e365f5e918daf9d37a4d01033652d9c36b2c68",
    "movement/movement_s3_64sc_20260329_125616.npz": "fb84bd00006920d9a93d32830c4bb81f8cdfbae17f8dba1a6ad67b1438fc7284",
    "test/test_c3_64sc_20260329_130804.npz": "e66e3be0f902f20db600695ba3518cb14954d44475d79599478e9029afc2a524",
}
FETCH_TIMEOUT_S = 60.0
_MAX_FILE_BYTES = 8 << 20  # the largest recording is under 200 kB


_STAGING = ".fetching-"  # + the fetching process's pid + "-" + a random tail


def _remove_orphaned_staging(folder: Path) -> None:
    """Remove the staging folders of fetches whose process is gone (killed mid-fetch);
    a live fetch's folder, a link, or a name not of this form is left alone."""
    for entry in folder.glob(f"{_STAGING}*"):
        pid = entry.name[len(_STAGING) :].partition("-")[0]
        if not pid.isdigit() or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except (PermissionError, OverflowError):
            continue  # another user's live process, or no such pid at all: not ours to judge


def cached_espectre() -> Path:
    return cache_root() / "espectre" / ESPECTRE_COMMIT[:12]


def espectre_root(path: str = "") -> Path:
    """The folder that holds ESPectre's recordings (module docstring), fetching them into
    the cache where no folder does; a one-line DataError when that fails."""
    if path:
        return Path(path) / "espectre"  # the config's own place: only there
    shared = Path(os.environ.get("MQTTFL_SHARED_DATA") or "../shared/data") / "espectre"
    if shared.is_dir():
        return shared
    cached = cached_espectre()
    if cached.is_dir() and not cached.is_symlink():
        return cached
    return fetch_espectre(cached, looked_in=shared)


def _source() -> str:
    return os.environ.get("MQTTFL_ESPECTRE_MIRROR") or GITHUB_RAW


def _location(source: str, name: str) -> str:
    relative = name if name == "LICENSE" else f"micro-espectre/data/{name}"
    if "://" in source:
        return source.rstrip("/") + "/" + relative
    return str(Path(source) / relative)


def _read(location: str) -> bytes:
    if "://" not in location:
        with open(location, "rb") as handle:
            return handle.read(_MAX_FILE_BYTES + 1)
    if not location.startswith(("http://", "https://", "file://")):
        raise ValueError("only http(s) and file URLs are fetched")
    with urllib.request.urlopen(location, timeout=FETCH_TIMEOUT_S) as response:
        data: bytes = response.read(_MAX_FILE_BYTES + 1)
        return data


def fetch_espectre(target: Path, *, looked_in: Path | None = None) -> Path:
    """Fetch every file of :data:`FILES` from the mirror, check each, and move the folder
    to ``target`` at once. Returns ``target``."""
    source = _source()
    log = get_logger()
    log.info("data.fetching", dataset="espectre", source=source, commit=ESPECTRE_COMMIT[:12])
    where = f"{looked_in} and " if looked_in is not None else ""
    advice = (
        f"put micro-espectre/data of {ESPECTRE_REPOSITORY} at commit {ESPECTRE_COMMIT[:12]} "
        f"in {target}, point data.path at a folder holding espectre/, or set "
        "MQTTFL_ESPECTRE_MIRROR to a checkout or a mirror URL of that commit"
    )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphaned_staging(target.parent)
        staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING}{os.getpid()}-", dir=target.parent))
    except OSError as exc:
        raise DataError(target, f"cannot create the cache: {one_line(exc)}; {advice}") from None
    try:
        for name, digest in FILES.items():
            location = _location(source, name)
            try:
                data = _read(location)
            except (OSError, ValueError, urllib.error.URLError) as exc:
                raise DataError(
                    location,
                    f"ESPectre's recordings are not in {where}the cache, and fetching them "
                    f"failed ({one_line(getattr(exc, 'reason', exc))}); {advice}",
                ) from None
            got = hashlib.sha256(data).hexdigest()
            if len(data) > _MAX_FILE_BYTES or got != digest:
                raise DataError(
                    location,
                    f"is not the file of commit {ESPECTRE_COMMIT[:12]} (SHA-256 {got[:16]}..., "
                    f"expected {digest[:16]}...); nothing was kept. {advice}",
                )
            out = staging / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        try:
            staging.rename(target)
        except OSError:
            if not (target.is_dir() and not target.is_symlink()):
                raise DataError(target, f"cannot be written; {advice}") from None
            # another process obtained it first: theirs is as good as ours
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("data.fetched", dataset="espectre", path=str(target), files=len(FILES))
    return target
