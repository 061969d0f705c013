"""Synthetic multi-room Wi-Fi CSI crowd counting (a stand-in for FedAPA's data).

FedAPA (Sec. V-A, Fig. 4) counts 0-20 people in six rooms whose label
distributions differ; its recordings share one 242-subcarrier grid (Sec. V-B).  This
module simulates that setting from a ray-style channel model instead of recording
it.  By default each room records with a different NIC (30 to 242 subcarriers, 2.4 or
5 GHz), a harder, device-heterogeneous variant; ``device="nexmon-vht80"`` puts every
room on the paper's grid.  For subcarrier frequency f (offset from the carrier fc) and packet
time t, the channel relative to the line-of-sight (LOS) path is

    H(f, t) = B(t) + A * sum_p a_p e^{-j2π f τ_p}
              + sum_k b_k(t) e^{-j2π (fc + f) τ_k(t)} + noise,

where B(t) is the LOS amplitude after people standing in its Fresnel zone block
it, A is the absorption of the static multipath by all bodies, the a_p/τ_p are
the room's fixed reflections, and each person k is a moving scatterer whose
excess delay τ_k(t) follows the TX -> person -> RX path length and whose gain
b_k(t) falls off as d0 / (d1 d2) (bistatic radar equation, relative to LOS).
A sample is |H| on a window of packets: time x subcarrier, as in Eq. (1).

The count shows up in the mean level (blocking, absorption), in the fading depth
across subcarriers (absorbed multipath) and in the temporal fluctuation (more
breathing, swaying and walking scatterers), while random body sizes, seats and
activity make nearby counts overlap.  As in recorded datasets, each count is
captured in a few sessions (a fixed crowd layout) cut into windows, so windows of
one label are correlated but not identical.  A LargeConvNet4 trained locally for
15 epochs (Sec. V-D settings) reaches about 40-90 % test accuracy (median ~50 %)
depending on the room; a linear fit on window statistics lands within +-2 people
~94 % of the time in most rooms, so far counts are rarely confused.

What a client can gain from the other rooms (``benchmarks/bench_crossroom.py``,
docs/benchmarks/accuracy.md): nothing on average, as in the real recordings (five
ESPectre chips in one home, one Intel 5300 in May and August), where pooling the other
clients' data costs a client 3.5 points (ESPectre) and 20 (Intel 5300, mean of
the two months).  The reason is the within-session test
split every one of these datasets uses: a client's test windows come from the crowd
layouts (sessions) it trained on, and a near-static seated crowd is a fingerprint a
client learns from its own windows; other clients' sessions, even in the same room, are
other fingerprints.  A common subcarrier grid does not change that (Pooled -0.9 points
on one grid).  Those figures predate the calibration below (docs/benchmarks/sessions.md
has both splits after it); nothing here was tuned so that a method wins.

Calibration (``benchmarks/bench_calibration.py``, docs/benchmarks/sessions.md, "Calibration"): what
each session choice is matched to.

- Sessions per count: three recording days per client (:data:`SESSIONS_PER_COUNT`), as
  the ESP32 crowd-counting set records each room (3 sessions); ESPectre has
  two recordings per label and chip, the Intel 5300 activity set two months.
- Windows per session: with the default 400 windows over the ~13 counts a room sees,
  about 10 windows of 3.2 s per count and day (~30 s of recording); an ESPectre recording
  is 10 s, 15-20 windows of 64 packets.
- How much a scene moves between windows and between sessions: measured on a window's
  mean amplitude profile (per subcarrier, divided by its mean), the real quiet-room
  recordings of ESPectre differ by a median RMS of 0.0066 between two windows of one
  recording and 0.133 between two recordings of one chip. The static reflections' change
  per window (:data:`_WINDOW_DRIFT`) and per session (:data:`_SESSION_DRIFT`) were set so
  that the simulator's empty rooms on the ESP32 grid measure the same way: 0.0070 and
  0.124 (they were 0.03 and 0.05: 0.017 and 0.034, sessions far less distinct than in
  real recordings). How far seated people move (:data:`_SHIFT_M`, :data:`_SWAY_M`) has no
  multi-day crowd recording to be matched to here and was left as it was.
- The level (the mean amplitude), on raw amplitude (``benchmarks/calibrate_rooms.py``):
  ESPectre's quiet recordings vary by a CV of 0.011 from window to window and 0.058
  between two recordings of one chip. The gain's wobble per window
  (:data:`WINDOW_LEVEL_SIGMA`) brings the empty rooms from 0.003 to 0.011; between days
  the static drift alone already gives them 0.085, so the gain a day holds
  (:data:`SESSION_LEVEL_SIGMA`) is 0.

Everything is derived from numpy Generators: ``(seed, room)`` fixes the room,
``(seed, client_id)`` the client's sessions and windows; nothing global is seeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from mqttfl.data.recordings import Split, WindowTable, check_split, split_table
from mqttfl.data.sessions import split_meta
from mqttfl.data.shard import Shard

ROOM_NAMES: tuple[str, ...] = (
    "living_room",
    "classroom",
    "bus",
    "conference_room",
    "hotel_room",
    "office",
)
# width, depth (m) and the base probability that a person walks rather than sits
_ROOM_LAYOUT: dict[str, tuple[float, float, float]] = {
    "living_room": (5.0, 4.0, 0.40),
    "classroom": (9.0, 7.0, 0.15),
    "bus": (10.0, 2.5, 0.10),
    "conference_room": (7.0, 5.0, 0.20),
    "hotel_room": (4.5, 3.5, 0.35),
    "office": (6.0, 5.0, 0.25),
}

SAMPLE_RATE_HZ = 20.0  # packets/s after the usual downsampling; 64 packets span 3.2 s
_LIGHT = 299_792_458.0
_TAP_NS = 1.0  # delay grid for people's paths; fine enough for 80 MHz (1/B = 12.5 ns)
_CHUNK_CELLS = 2_000_000  # (packet, subcarrier) cells simulated at once: bounds peak memory
_MARGIN = 0.3  # people keep this far (m) from the walls
SESSIONS_PER_COUNT = 3  # recording days per client: one crowd layout per count each day
_SHIFT_M = 0.002  # how far (std, m) a seated person's position varies between windows
_ROAM_M = 0.5  # how far (std, m) a walker starts from their usual spot
_SWAY_M = 0.003  # amplitude (m) of each postural sway component
WALK_SCALE = 1.0  # a factor on every room's probability that a person walks
WALK_TOP_SPEED = 1.2  # walkers' speeds are uniform in [0.3, this] m/s
# How much the static reflections (doors, chairs, furniture) change: between sessions,
# and between two windows of one session (std of the relative complex gain change).
_SESSION_DRIFT = 0.2
_WINDOW_DRIFT = 0.006
# The receiver gain a session holds (AGC, which an ESP32 cannot lock): lognormal σ of the
# day's level. 0: the static drift between days already moves an empty room's mean
# amplitude more (CV 0.085) than two of ESPectre's quiet recordings differ (0.058).
SESSION_LEVEL_SIGMA = 0.0
# The receiver gain's wobble from one window to the next around the session's level
# (lognormal σ per window): an empty simulated room otherwise measures a within-session CV
# of the window mean amplitude of 0.003 against 0.011 in ESPectre's quiet recordings
# (benchmarks/calibrate_rooms.py).
WINDOW_LEVEL_SIGMA = 0.011


@dataclass(frozen=True)
class Device:
    """A CSI-capable NIC: how many subcarriers it reports over what span."""

    name: str
    subcarriers: int
    span_hz: float
    carrier_hz: float


DEVICES: tuple[Device, ...] = (
    Device("intel5300", 30, 17.5e6, 5.32e9),  # 30 grouped subcarriers of HT20
    Device("atheros-ht20", 52, 16.25e6, 5.18e9),
    Device("atheros-ht20-56", 56, 17.5e6, 5.22e9),
    Device("esp32", 64, 20.0e6, 2.437e9),
    Device("atheros-ht40", 114, 35.625e6, 5.19e9),
    Device("nexmon-vht80", 242, 75.625e6, 5.21e9),
)


@dataclass(frozen=True, eq=False)
class Room:
    """Fixed properties of one environment; derived from (seed, room index)."""

    index: int
    name: str
    size: tuple[float, float]
    tx: np.ndarray  # (2,) metres
    rx: np.ndarray  # (2,)
    device: Device
    mp_delays: np.ndarray  # (P,) excess delays of static reflections, seconds
    mp_gains: np.ndarray  # (P,) complex, relative to LOS
    ripple: np.ndarray  # (S,) device frequency response magnitude
    noise_std: float  # complex noise std relative to LOS amplitude
    walk_prob: float
    absorption: float  # mean fraction of multipath power one body absorbs
    label_probs: np.ndarray  # (num_classes,), zero for counts never seen here

    @property
    def freqs(self) -> np.ndarray:
        """Subcarrier offsets from the carrier, Hz."""
        half = self.device.span_hz / 2
        return np.linspace(-half, half, self.device.subcarriers)


def _label_probs(rng: np.random.Generator, num_classes: int) -> np.ndarray:
    """A skewed count distribution over a contiguous ~50-70 % of the counts (Fig. 4)."""
    lo_w = max(1, round(0.48 * num_classes))
    hi_w = max(lo_w, round(0.72 * num_classes))
    width = min(num_classes, int(rng.integers(lo_w, hi_w + 1)))
    lo = int(rng.integers(0, num_classes - width + 1))
    counts = np.arange(lo, lo + width)
    centre = rng.uniform(lo, lo + width - 1)
    spread = width * rng.uniform(0.3, 0.7)
    w = np.exp(-0.5 * ((counts - centre) / spread) ** 2) * rng.gamma(3.0, 1.0, width)
    w = w / w.sum() + 0.3 / width  # floor: every covered count keeps some samples
    probs = np.zeros(num_classes)
    probs[counts] = w / w.sum()
    return probs


def device_named(name: str) -> Device:
    for device in DEVICES:
        if device.name == name:
            return device
    raise ValueError(f"unknown CSI device {name!r}; known: {', '.join(d.name for d in DEVICES)}")


def room_profile(
    room_index: int, *, seed: int, num_classes: int = 21, device: str = "per-room"
) -> Room:
    """The room ``room_index`` (0..5) of the world defined by ``seed``.

    ``device`` names the NIC every room records with, or is ``"per-room"``: each room
    gets a different one (a seeded permutation of :data:`DEVICES`)."""
    if not 0 <= room_index < len(ROOM_NAMES):
        raise ValueError(f"room_index must be in 0..{len(ROOM_NAMES) - 1}, got {room_index}")
    rng = np.random.default_rng([seed, 0, room_index])
    name = ROOM_NAMES[room_index]
    width, depth, walk = _ROOM_LAYOUT[name]
    width, depth = width * rng.uniform(0.85, 1.15), depth * rng.uniform(0.85, 1.15)
    # a seeded permutation so that the six rooms always have six different devices
    own_device = DEVICES[
        int(np.random.default_rng([seed, 2]).permutation(len(DEVICES))[room_index])
    ]
    nic = own_device if device == "per-room" else device_named(device)
    tx = np.array([rng.uniform(0.2, 0.3 * width), rng.uniform(0.2 * depth, 0.8 * depth)])
    rx = np.array([rng.uniform(0.7 * width, width - 0.2), rng.uniform(0.2 * depth, 0.8 * depth)])
    n_paths = int(rng.integers(6, 13))
    excess = np.sort(rng.uniform(3e-9, 2.2 * np.hypot(width, depth) / _LIGHT, n_paths))
    amp = rng.uniform(0.4, 1.0, n_paths) * np.exp(-excess / 40e-9)
    gains = amp * np.exp(2j * np.pi * rng.random(n_paths))
    s = nic.subcarriers
    # smooth passband ripple of the NIC's filters (under a dB)
    k = np.linspace(0, 1, s)
    ripple = 1 + sum(
        rng.normal(0, 0.03) * np.cos(2 * np.pi * (i + 1) * k + rng.uniform(0, 2 * np.pi))
        for i in range(3)
    )
    return Room(
        index=room_index,
        name=name,
        size=(float(width), float(depth)),
        tx=tx,
        rx=rx,
        device=nic,
        mp_delays=excess,
        mp_gains=gains,
        ripple=np.asarray(ripple, dtype=np.float64),
        noise_std=float(rng.uniform(0.02, 0.08)),
        walk_prob=float(np.clip(WALK_SCALE * walk * rng.uniform(0.8, 1.25), 0.0, 0.9)),
        absorption=float(rng.uniform(0.04, 0.07)),
        # own stream, so the label skew does not move when the physics is retuned
        label_probs=_label_probs(np.random.default_rng([seed, 3, room_index]), num_classes),
    )


def _fold(x: np.ndarray, lo: float | np.ndarray, hi: float | np.ndarray) -> np.ndarray:
    """Reflect coordinates back into [lo, hi]: walkers bounce off the walls."""
    span = hi - lo
    y = np.mod(x - lo, 2 * span)
    return lo + np.where(y > span, 2 * span - y, y)


def _complex_normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return cast(
        "np.ndarray", (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2)
    )


def draw_sessions(rng: np.random.Generator, room: Room, n_sessions: int) -> dict[str, np.ndarray]:
    """Recording sessions: for every count, a few fixed crowds (who sits where, how big).

    Real CSI datasets record each count in a handful of sessions and cut them into
    windows, so windows of one label share a crowd layout; arrays are (C, n_sessions, K).
    """
    c = room.label_probs.size
    shape = (c, n_sessions, max(c - 1, 1))
    hi = np.asarray(room.size) - _MARGIN
    walking = rng.random(shape) < room.walk_prob
    return {
        "seat": rng.uniform(_MARGIN, hi, (*shape, 2)),
        "speed": np.where(walking, rng.uniform(0.3, WALK_TOP_SPEED, shape), 0.0),
        "rho": rng.lognormal(np.log(0.2), 0.25, shape),  # radar cross-section (body size)
        "beta": rng.uniform(0.2, 0.45, shape),  # LOS attenuation when fully blocking
        "alpha": room.absorption * rng.uniform(0.8, 1.2, shape),
        "drift": _SESSION_DRIFT * _complex_normal(rng, (c, n_sessions, room.mp_gains.size)),
        # the AGC setting a recording day holds, the same for every count recorded that day
        "level": np.broadcast_to(
            rng.lognormal(0.0, SESSION_LEVEL_SIGMA, n_sessions), (c, n_sessions)
        ),
    }


def _trajectories(
    rng: np.random.Generator, room: Room, seat: np.ndarray, speed: np.ndarray, window: int
) -> np.ndarray:
    """Positions (n, K, T, 2): walkers roam from near their seat, others fidget in it."""
    n, k = speed.shape
    hi = np.asarray(room.size) - _MARGIN
    t = np.arange(window) / SAMPLE_RATE_HZ
    roam = np.where(speed > 0, _ROAM_M, _SHIFT_M)[..., None]
    start = seat + roam * rng.standard_normal((n, k, 2))
    # correlated random walk: the heading drifts a little every packet
    heading = rng.uniform(0, 2 * np.pi, (n, k, 1)) + np.cumsum(
        rng.normal(0, 0.1, (n, k, window)), axis=-1
    )
    step = (speed / SAMPLE_RATE_HZ)[..., None, None] * np.stack(
        [np.cos(heading), np.sin(heading)], axis=-1
    )
    walk = np.cumsum(step, axis=2) - step[:, :, :1]
    # everybody breathes (a few mm at 0.2-0.4 Hz) and sways a little (postural sway,
    # two slow sinusoids per axis): both bounded, so seated people stay put
    breath_amp = rng.uniform(0.002, 0.006, (n, k, 1))
    breath = breath_amp * np.sin(
        2 * np.pi * rng.uniform(0.2, 0.4, (n, k, 1)) * t + rng.uniform(0, 2 * np.pi, (n, k, 1))
    )
    facing = rng.uniform(0, 2 * np.pi, (n, k))
    breath = breath[..., None] * np.stack([np.cos(facing), np.sin(facing)], axis=-1)[:, :, None]
    sway_freq = rng.uniform(0.05, 1.0, (n, k, 1, 2, 2))
    sway_phase = rng.uniform(0, 2 * np.pi, (n, k, 1, 2, 2))
    sway_amp = rng.uniform(0, _SWAY_M, (n, k, 1, 2, 2))
    sway = np.sum(sway_amp * np.sin(2 * np.pi * sway_freq * t[:, None, None] + sway_phase), axis=-1)
    return _fold(start[:, :, None, :] + walk + breath + sway, _MARGIN, hi)


def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from points p (..., 2) to the segment a-b (the LOS path)."""
    ab = b - a
    u = np.clip((p - a) @ ab / (ab @ ab), 0.0, 1.0)
    return cast("np.ndarray", np.linalg.norm(p - (a + u[..., None] * ab), axis=-1))


def _people_channel(room: Room, gain: np.ndarray, excess: np.ndarray) -> np.ndarray:
    """sum_k gain_k e^{-j2π f τ_k} for every (sample, packet), shape (n, T, S).

    Each path's complex gain is split between the two nearest taps of a 1 ns delay
    grid (fractional delay), after which one matmul with the (taps x subcarriers)
    Fourier matrix replaces n*K*T*S complex exponentials.
    """
    n, _, window = gain.shape
    pos = excess / (_TAP_NS * 1e-9)
    l0 = np.floor(pos).astype(np.int64)
    frac = pos - l0
    n_taps = int(l0.max()) + 2
    row = (np.arange(n)[:, None, None] * window + np.arange(window)[None, None, :]) * n_taps
    idx = np.concatenate([(row + l0).ravel(), (row + l0 + 1).ravel()])
    w = np.concatenate([(gain * (1 - frac)).ravel(), (gain * frac).ravel()])
    size = n * window * n_taps
    taps = np.bincount(idx, w.real, size) + 1j * np.bincount(idx, w.imag, size)
    delays = np.arange(n_taps) * _TAP_NS * 1e-9
    fourier = np.exp(-2j * np.pi * np.outer(delays, room.freqs)).astype(np.complex64)
    h = taps.astype(np.complex64).reshape(n * window, n_taps) @ fourier
    return h.reshape(n, window, -1)


def simulate(
    rng: np.random.Generator,
    room: Room,
    counts: np.ndarray,
    scene: dict[str, np.ndarray],
    window: int,
) -> np.ndarray:
    """CSI amplitude windows (n, T, S) float32; ``scene`` holds per-sample session arrays."""
    n = len(counts)
    fc = room.device.carrier_hz
    d0 = float(np.linalg.norm(room.tx - room.rx))
    pos = _trajectories(rng, room, scene["seat"], scene["speed"], window)
    present = (np.arange(scene["speed"].shape[1]) < counts[:, None])[..., None]  # (n, K, 1)
    d1 = np.linalg.norm(pos - room.tx, axis=-1)
    d2 = np.linalg.norm(pos - room.rx, axis=-1)
    excess = (d1 + d2 - d0) / _LIGHT  # >= 0 by the triangle inequality

    # each person scatters with bistatic radar falloff d0 / (d1 d2) relative to LOS;
    # the 1.5 m floor stands for the devices being out of reach on a shelf or wall
    amp = present * scene["rho"][..., None] * d0 / (np.maximum(d1, 1.5) * np.maximum(d2, 1.5))
    h_people = _people_channel(room, amp * np.exp(-2j * np.pi * fc * excess), excess)

    # bodies inside the LOS Fresnel zone shadow it (half-width ~ sqrt(λ d0)/2 + body)
    fresnel = np.hypot(np.sqrt(_LIGHT / fc * d0) / 2, 0.2)
    shadow = np.exp(-((_segment_distance(pos, room.tx, room.rx) / fresnel) ** 2))
    block = 1 - scene["beta"][..., None] * shadow
    los = np.exp(np.sum(np.where(present, np.log(block), 0.0), axis=1)).astype(np.float32)
    # every body absorbs a little of the energy bouncing around the room
    absorb = np.exp(np.sum(present[..., 0] * np.log1p(-scene["alpha"]), axis=1))  # (n,)
    absorb = absorb.astype(np.float32)

    # static reflections: session drift (doors, chairs) plus a little per window
    drift = scene["drift"] + _WINDOW_DRIFT * _complex_normal(rng, scene["drift"].shape)
    steer = np.exp(-2j * np.pi * np.outer(room.mp_delays, room.freqs))
    h_static = ((room.mp_gains * (1 + drift)) @ steer).astype(np.complex64)  # (n, S)

    h = los[..., None] + (absorb[:, None] * h_static)[:, None, :] + h_people
    # automatic gain control: the session's level plus per-packet jitter
    agc = scene["level"][:, None, None] * rng.lognormal(0, 0.01, (n, window, 1))
    if WINDOW_LEVEL_SIGMA > 0:
        agc = agc * rng.lognormal(0, WINDOW_LEVEL_SIGMA, (n, 1, 1))
    gain = (room.ripple * agc).astype(np.float32)  # float32: (n, T, S) arrays dominate the cost
    shape = (n, window, room.device.subcarriers)
    noise = rng.standard_normal(shape, dtype=np.float32) + 1j * rng.standard_normal(
        shape, dtype=np.float32
    )
    h = h * gain + np.float32(room.noise_std / np.sqrt(2)) * noise
    # scale by the empty room's typical level so values are O(1) in every room
    ref = float(np.median(np.abs(room.ripple * (1 + room.mp_gains @ steer))))
    return cast("np.ndarray", np.abs(h) / np.float32(ref))


def make_room_shard(
    client_id: int,
    *,
    seed: int,
    window: int = 64,
    samples: int = 400,
    num_classes: int = 21,
    test_fraction: float = 0.2,
    device: str = "per-room",
    split: Split = "window",
) -> Shard:
    """Simulate the local dataset of ``client_id`` living in room ``client_id % 6``.

    Clients with the same room share its geometry, device and label distribution
    but record their own sessions and windows.  Labels are people counts
    0..num_classes-1.  ``split="window"``: ~80/20 (FedAPA Sec. V-D), stratified by
    label, so test windows share their crowd layouts with training windows.
    ``split="session"``: session ``d`` is the client's recording day ``d`` (one crowd
    layout per count), and whole days are held out (:mod:`mqttfl.data.sessions`): with
    three days and ``test_fraction`` 0.2, the third day is the test day.
    """
    split = check_split(split)
    if client_id < 0 or seed < 0:
        raise ValueError("client_id and seed must be non-negative")
    if window < 1 or samples < 2 or num_classes < 2:
        raise ValueError("need window >= 1, samples >= 2 and num_classes >= 2")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    room = room_profile(
        client_id % len(ROOM_NAMES), seed=seed, num_classes=num_classes, device=device
    )
    rng = np.random.default_rng([seed, 1, client_id])
    sessions = draw_sessions(rng, room, SESSIONS_PER_COUNT)
    y = rng.choice(num_classes, size=samples, p=room.label_probs).astype(np.int64)
    which = rng.integers(0, SESSIONS_PER_COUNT, samples)
    chunk = max(1, _CHUNK_CELLS // (window * room.device.subcarriers))
    parts = []
    for i in range(0, samples, chunk):
        sl = slice(i, i + chunk)
        scene = {key: v[y[sl], which[sl]] for key, v in sessions.items()}
        parts.append(simulate(rng, room, y[sl], scene, window))
    x = np.concatenate(parts)
    names = [f"day-{d}" for d in range(SESSIONS_PER_COUNT)]
    session_ids = which.astype(np.int64)
    # simulated windows have no time order; days record every count
    table = WindowTable(session_ids, y, names, sessions_are_days=True)
    chosen = split_table(table, split, test_fraction, rng=rng)
    train, test = chosen.train, chosen.test
    if split == "session":
        split_info = split_meta(which, y, chosen.held, names, test_fraction)
    else:
        split_info = {
            "method": "window",
            "test_fraction": test_fraction,
            "detail": "stratified by label; test windows share crowd layouts with train",
        }
    meta = _room_meta(room, client_id, seed, window, num_classes, y[train], names, split_info)
    return Shard(
        x[train],
        y[train],
        x[test],
        y[test],
        meta,
        s_train=session_ids[train],
        s_test=session_ids[test],
    )


def _room_meta(
    room: Room,
    client_id: int,
    seed: int,
    window: int,
    num_classes: int,
    y_train: np.ndarray,
    sessions: list[str],
    split_info: dict[str, object],
) -> dict[str, object]:
    labels, freq = np.unique(y_train, return_counts=True)
    return {
        "source": "synthetic",
        "room": room.name,
        "room_index": room.index,
        "client_id": client_id,
        "seed": seed,
        "device": room.device.name,
        "subcarriers": room.device.subcarriers,
        "carrier_hz": room.device.carrier_hz,
        "window": window,
        "sample_rate_hz": SAMPLE_RATE_HZ,
        "num_classes": num_classes,
        "label_counts": {str(int(c)): int(m) for c, m in zip(labels, freq, strict=True)},
        "ordinal": True,  # people counts
        "sessions": sessions,
        "split": split_info,
    }
