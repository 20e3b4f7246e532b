"""Channel parameters of the simulated room: what every stage of screen -> light -> camera does.

Consumes: a profile name and the override tables of the config
(`room.channel`, room-wide; `room.nodes[i].channel`, per node). Emits: one
frozen `ChannelParams` per node, describing that node's pose, its screen and
its camera. A node's table overrides the room's, which overrides the profile.

Every parameter has a neutral value that switches its stage off (0 blur,
0 noise, codec "none", ...); `disable = ["noise", "blur", ...]` switches
stages off by name without knowing their parameters. Unknown keys, wrong
types and out-of-range values raise ValueError naming the key, e.g.
"room.nodes[1].channel.exposure_ms: must be >= 0, got -3".

Colour conventions: matrices and per-channel triples here are written in
RGB order (as people read them); the renderer converts to OpenCV's BGR.
Linear light is relative to the screen's white at the camera's reference
exposure (1.0 = full scale of the sensor).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

# Stage name -> the parameter values that switch it off.
STAGES: dict[str, dict[str, Any]] = {
    "distortion": {"distortion_k1": 0.0, "distortion_k2": 0.0},
    "blur": {"blur_sigma_px": 0.0},
    "moire": {"screen_subpixel": 0.0},
    "vignetting": {"vignette": 0.0},
    "shading": {"shading": 0.0, "shading_chroma": 0.0},
    "viewing_angle": {"screen_angle_falloff": 0.0},
    "crosstalk": {"crosstalk": ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))},
    "white_balance": {"white_balance": (1.0, 1.0, 1.0), "awb_drift": 0.0},
    "black_level": {"black_level": (0.0, 0.0, 0.0), "flare": (0.0, 0.0, 0.0), "screen_black": 0.0},
    "ambient": {"ambient": 0.0},
    "glare": {"glare": 0.0},
    "auto_exposure": {"auto_exposure": False, "ae_drift": 0.0},
    "noise": {"read_noise": 0.0, "shot_noise": 0.0},
    "rolling_shutter": {"readout_ms": 0.0},
    "scanout": {"screen_scanout": 0.0},
    "vsync": {"screen_refresh_hz": 0.0},
    "jitter": {"jitter_ms": 0.0},
    "latency": {"latency_ms": 0.0},
    "drops": {"drop_prob": 0.0},
    "stalls": {"stall_rate_hz": 0.0},
    "compression": {"codec": "none"},
}

_IDENTITY = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))


@dataclass(frozen=True)
class ChannelParams:
    """One node's pose, screen and camera. Units in the names; see NOTES.md for the model."""

    # -- room layout and pose (the node's screen centre is the body origin) --
    distance_m: float = 0.6            # distance between neighbouring nodes on the default circle
    position_m: tuple[float, float, float] | None = None  # screen centre (x east, y up, z north); None: on the circle
    yaw_deg: float = 0.0               # turn left(+)/right(-) from aiming at the other screens
    pitch_deg: float = 0.0             # tilt up(+)/down(-) from that aim
    roll_deg: float = 0.0              # roll about the viewing axis
    camera_offset_m: tuple[float, float] | None = None  # camera (x right, y up) from the screen centre; None: top bezel
    aim: str | None = None             # a node's name: face that node's screen centre (None: the mean of the others)

    # -- screen --
    screen_diag_in: float = 13.3       # physical diagonal; aspect from the resolution
    screen_refresh_hz: float = 60.0    # a shown image goes up at the next refresh (0: at once)
    screen_scanout: float = 0.0        # fraction of a refresh period the panel takes to update top to bottom
    screen_gamma: float = 2.2          # display transfer: light = value ** gamma
    screen_black: float = 0.0          # light of a black pixel, fraction of white (LCD leakage)
    screen_brightness: float = 1.0     # white level in linear units at the reference exposure
    screen_subpixel: float = 0.0       # 0..1: contrast of the RGB stripe / black-matrix structure (moire)
    screen_angle_falloff: float = 0.0  # brightness * cos(viewing angle) ** this
    bezel_m: float = 0.008             # dark frame around the screen

    # -- camera geometry and optics --
    camera_width: int = 1280
    camera_height: int = 720
    fps: float | None = None           # None: config.camera.fps
    hfov_deg: float = 62.0             # horizontal field of view
    distortion_k1: float = 0.0         # radial lens distortion (OpenCV model, normalised coordinates)
    distortion_k2: float = 0.0
    blur_sigma_px: float = 0.0         # defocus / lens blur, Gaussian sigma in camera pixels
    vignette: float = 0.0              # light fall-off at the image corner (0.3: corners get 70 %)
    shading: float = 0.0               # smooth brightness non-uniformity over a screen (backlight, ISP), std
    shading_chroma: float = 0.0        # smooth colour non-uniformity (per channel, 16 px correlation), std

    # -- camera colour and tone --
    crosstalk: tuple[tuple[float, float, float], ...] = _IDENTITY  # camera RGB = M @ screen RGB (linear)
    white_balance: tuple[float, float, float] = (1.0, 1.0, 1.0)   # RGB gains
    camera_gamma: float = 2.2          # output = 255 * linear ** (1 / camera_gamma) (+ black level)
    black_level: tuple[float, float, float] = (0.0, 0.0, 0.0)      # RGB, added to the output (DN)
    flare: tuple[float, float, float] = (0.0, 0.0, 0.0)            # RGB, added in linear light (<0: ISP black crush)
    ambient: float = 0.0               # room light on walls/objects, linear (0.15: an evening room)
    glare: float = 0.0                 # room light reflected by the screen surface, linear
    glare_gradient: float = 0.0        # relative change of the glare across the screen (0.5: 0.75x..1.25x)

    # -- auto exposure / white balance drift --
    auto_exposure: bool = False
    exposure_gain: float = 1.0         # fixed gain (with auto exposure: the gain for the reference scene)
    ae_reference: float = 0.3          # mean linear screen light at which the AE gain equals exposure_gain
    ae_tau_s: float = 0.5              # the AE's lag (first-order time constant)
    ae_range: float = 4.0              # the AE gain stays within exposure_gain / range .. * range
    ae_drift: float = 0.0              # relative amplitude of the slow exposure drift
    awb_drift: float = 0.0             # relative amplitude of the slow per-channel white balance drift
    drift_period_s: float = 20.0       # typical period of both drifts

    # -- sensor noise (linear units; 1.0 = full scale) --
    read_noise: float = 0.0            # sigma at zero signal
    shot_noise: float = 0.0            # variance per unit of signal (1 / full-well electrons)
    noise_grain_px: float = 0.0        # spatial correlation of the noise (demosaic/denoise), Gaussian sigma

    # -- time --
    exposure_ms: float = 0.0           # each row integrates light this long (0: an instant)
    readout_ms: float = 0.0            # rolling shutter: the last row starts this much after the first
    jitter_ms: float = 0.0             # sigma of capture start time jitter
    latency_ms: float = 0.0            # from end of readout to delivery (the timestamp is the delivery time)
    drop_prob: float = 0.0             # probability that a capture is lost
    stall_rate_hz: float = 0.0         # camera stalls per second (Poisson)
    stall_ms: tuple[float, float] = (150.0, 400.0)  # stall duration range

    # -- compression of the camera stream --
    codec: str = "none"                # "none", "mjpeg" (JPEG per frame) or "h264" (PyAV libx264)
    jpeg_quality: int = 75
    jpeg_subsampling: str = "420"      # "420", "422" or "444"
    h264_crf: int = 28
    h264_preset: str = "ultrafast"

    disable: tuple[str, ...] = ()      # stage names switched off (see STAGES)

    def resolved(self) -> ChannelParams:
        """These parameters with every disabled stage set to its neutral values."""
        if not self.disable:
            return self
        changes: dict[str, Any] = {}
        for stage in self.disable:
            changes.update(STAGES[stage])
        return dataclasses.replace(self, **changes)


# Fitted on ../shared/realcaps (python -m wccl.room.fit, see fitted.json and NOTES.md):
# median over the 7 photos of a phone camera, then made worse where a laptop
# webcam is worse than a phone (blur, noise, compression), never better.
_WEBCAM_CROSSTALK = ((0.93, 0.28, 0.05), (0.22, 1.01, 0.17), (0.11, 0.10, 0.92))

PROFILES: dict[str, dict[str, Any]] = {
    # Perfect optics and sensor, but real geometry: the other screen seen
    # straight-on from a camera at the screen centre, resampled onto the
    # sensor's pixels. No noise, no colour change, no timing effects.
    "ideal": dict(
        camera_offset_m=(0.0, 0.0),
        screen_refresh_hz=0.0,
    ),
    # A 720p/30 laptop webcam ~60 cm from a 13.3" screen turned ~15 degrees.
    "webcam": dict(
        distance_m=0.6, yaw_deg=13.0, pitch_deg=-4.0, roll_deg=1.5,
        screen_scanout=1.0, screen_black=0.002, screen_subpixel=1.0, screen_angle_falloff=1.0,
        hfov_deg=62.0, distortion_k1=-0.06, distortion_k2=0.01, blur_sigma_px=1.2, vignette=0.6,
        shading=0.08, shading_chroma=0.05,
        crosstalk=_WEBCAM_CROSSTALK, white_balance=(1.0, 1.0, 1.0), camera_gamma=1.31,
        black_level=(6.5, 8.2, 3.3), flare=(-0.046, -0.060, -0.016),
        ambient=0.12, glare=0.015, glare_gradient=0.6,
        auto_exposure=True, exposure_gain=1.0, ae_reference=0.3, ae_tau_s=0.5, ae_range=3.0,
        ae_drift=0.04, awb_drift=0.02, drift_period_s=20.0,
        read_noise=0.006, shot_noise=0.0016, noise_grain_px=0.7,
        exposure_ms=16.0, readout_ms=25.0, jitter_ms=2.0, latency_ms=40.0,
        drop_prob=0.01, stall_rate_hz=1 / 120, stall_ms=(150.0, 400.0),
        codec="mjpeg", jpeg_quality=60, jpeg_subsampling="420",
    ),
    # A dim room, 15 fps, a steeper angle, stronger noise and colour cast, H.264.
    "harsh": dict(
        distance_m=0.75, yaw_deg=22.0, pitch_deg=-6.0, roll_deg=3.0,
        screen_scanout=1.0, screen_black=0.004, screen_subpixel=1.0, screen_angle_falloff=2.0,
        fps=15.0, hfov_deg=70.0, distortion_k1=-0.12, distortion_k2=0.02, blur_sigma_px=1.5, vignette=0.6,
        shading=0.12, shading_chroma=0.04,
        crosstalk=((0.90, 0.30, 0.10), (0.15, 0.90, 0.25), (0.15, 0.30, 0.85)),
        white_balance=(1.15, 1.0, 0.8), camera_gamma=1.3,
        black_level=(10.0, 12.0, 9.0), flare=(-0.046, -0.060, -0.016),
        ambient=0.04, glare=0.03, glare_gradient=1.0,
        auto_exposure=True, exposure_gain=0.8, ae_reference=0.3, ae_tau_s=0.8, ae_range=4.0,
        ae_drift=0.08, awb_drift=0.05, drift_period_s=15.0,
        read_noise=0.015, shot_noise=0.004, noise_grain_px=0.8,
        exposure_ms=50.0, readout_ms=50.0, jitter_ms=6.0, latency_ms=80.0,
        drop_prob=0.05, stall_rate_hz=1 / 30, stall_ms=(200.0, 800.0),
        codec="h264", h264_crf=30, h264_preset="ultrafast",
    ),
}

PROFILE_NAMES = ("exact", *PROFILES)

_FIELDS = {f.name: f for f in fields(ChannelParams)}


def _check_value(name: str, value: Any, where: str) -> Any:
    """Coerce one override to its parameter's type; ValueError names `where`."""
    bad = f"{where}.{name}"

    def num(v, lo=None, hi=None, integer=False):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{bad}: expected a number, got {v!r}")
        if integer and int(v) != v:
            raise ValueError(f"{bad}: expected an integer, got {v!r}")
        if lo is not None and v < lo:
            raise ValueError(f"{bad}: must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise ValueError(f"{bad}: must be <= {hi}, got {v}")
        return int(v) if integer else float(v)

    def triple(v, n=3, lo=None):
        if not isinstance(v, (list, tuple)) or len(v) != n:
            raise ValueError(f"{bad}: expected a list of {n} numbers, got {v!r}")
        return tuple(num(x, lo) for x in v)

    ranges: dict[str, tuple] = {
        "distance_m": (0.05, 100), "screen_diag_in": (1, 200), "screen_refresh_hz": (0, 1000),
        "screen_scanout": (0, 1), "screen_gamma": (0.1, 5), "screen_black": (0, 1), "screen_brightness": (0, 100),
        "screen_subpixel": (0, 1), "screen_angle_falloff": (0, 20), "bezel_m": (0, 1),
        "hfov_deg": (1, 170), "distortion_k1": (-1, 1), "distortion_k2": (-1, 1), "blur_sigma_px": (0, 20),
        "vignette": (0, 0.95), "shading": (0, 0.5), "shading_chroma": (0, 0.5), "camera_gamma": (0.1, 5),
        "ambient": (0, 10), "glare": (0, 10),
        "glare_gradient": (0, 2), "exposure_gain": (1e-3, 1e3), "ae_reference": (1e-4, 10), "ae_tau_s": (1e-3, 100),
        "ae_range": (1, 1000), "ae_drift": (0, 0.9), "awb_drift": (0, 0.9), "drift_period_s": (0.1, 1e4),
        "read_noise": (0, 1), "shot_noise": (0, 1), "noise_grain_px": (0, 5),
        "exposure_ms": (0, 1000), "readout_ms": (0, 1000), "jitter_ms": (0, 1000), "latency_ms": (0, 10000),
        "drop_prob": (0, 0.99), "stall_rate_hz": (0, 100), "yaw_deg": (-180, 180), "pitch_deg": (-90, 90),
        "roll_deg": (-180, 180),
    }
    if name in ranges:
        return num(value, *ranges[name])
    if name in ("camera_width", "camera_height"):
        return num(value, 16, 8192, integer=True)
    if name == "fps":
        return None if value is None else num(value, 0.1, 240)
    if name == "jpeg_quality":
        return num(value, 1, 100, integer=True)
    if name == "h264_crf":
        return num(value, 0, 51, integer=True)
    if name == "position_m":
        return None if value is None else triple(value)
    if name == "camera_offset_m":
        return None if value is None else triple(value, 2)
    if name == "aim":
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{bad}: expected a node's name, got {value!r}")
        return value
    if name in ("white_balance",):
        return triple(value, lo=0)
    if name in ("black_level", "flare"):
        return triple(value)
    if name == "stall_ms":
        lo, hi = triple(value, 2, lo=0)
        if hi < lo:
            raise ValueError(f"{bad}: [min, max] with min <= max, got {value!r}")
        return (lo, hi)
    if name == "crosstalk":
        if not isinstance(value, (list, tuple)) or len(value) != 3:
            raise ValueError(f"{bad}: expected a 3x3 matrix (3 lists of 3 numbers), got {value!r}")
        return tuple(triple(row) for row in value)
    if name == "auto_exposure":
        if not isinstance(value, bool):
            raise ValueError(f"{bad}: expected true or false, got {value!r}")
        return value
    if name == "codec":
        if value not in ("none", "mjpeg", "h264"):
            raise ValueError(f"{bad}: expected 'none', 'mjpeg' or 'h264', got {value!r}")
        return value
    if name == "jpeg_subsampling":
        if value not in ("420", "422", "444"):
            raise ValueError(f"{bad}: expected '420', '422' or '444', got {value!r}")
        return value
    if name == "h264_preset":
        presets = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium")
        if value not in presets:
            raise ValueError(f"{bad}: expected one of {', '.join(presets)}, got {value!r}")
        return value
    if name == "disable":
        if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
            raise ValueError(f"{bad}: expected a list of stage names, got {value!r}")
        unknown = [s for s in value if s not in STAGES]
        if unknown:
            raise ValueError(f"{bad}: unknown stage(s) {', '.join(unknown)}; stages are {', '.join(STAGES)}")
        return tuple(value)
    raise AssertionError(name)  # every field is handled above


def check_overrides(table: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """Validate one override table (`where` names it, e.g. "room.nodes[1].channel")."""
    out: dict[str, Any] = {}
    for key, value in (table or {}).items():
        if key not in _FIELDS:
            raise ValueError(f"{where}.{key}: unknown channel parameter; known: {', '.join(sorted(_FIELDS))}")
        out[key] = _check_value(key, value, where)
    return out


# Where a laptop stands: a room's poses may stay when its profile is switched to `exact` (the perfect camera
# sees screens side by side and ignores them); any other channel parameter is an error there.
POSE_KEYS = frozenset({"distance_m", "position_m", "yaw_deg", "pitch_deg", "roll_deg", "camera_offset_m", "aim"})
OTHER_PROFILES = "(choose profile 'ideal', 'webcam' or 'harsh')"


def check_profile(profile: str, rendered: bool = False) -> None:
    """A profile's name is one of PROFILE_NAMES (`rendered`: one with channel parameters, not `exact`)."""
    if profile not in (PROFILES if rendered else PROFILE_NAMES):
        raise ValueError(f"room.profile: unknown profile {profile!r}; profiles are {', '.join(PROFILE_NAMES)}"
                         if profile not in PROFILE_NAMES else f"room.profile: the {profile!r} profile has no channel")


def exact_room_problem(room: dict[str, Any] | None, nodes: list[dict[str, Any]],
                       changes: list[list] | None = None) -> tuple[str, tuple] | None:
    """What an `exact` room's tables hold that it cannot take, in words, and the key path it is at (below
    `room`: ("channel",), ("nodes", i, "channel"), ("nodes", i, "changes")); None if nothing. The one rule,
    for the config and the room alike."""
    if room:
        return f"the 'exact' profile takes no channel parameters {OTHER_PROFILES}", ("channel",)
    for i, table in enumerate(nodes):
        if set(table) - POSE_KEYS:
            return (f"the 'exact' profile takes no channel parameters but a pose ({', '.join(sorted(POSE_KEYS))})",
                    ("nodes", i, "channel"))
    for i, node_changes in enumerate(changes or []):
        if node_changes:
            return f"the 'exact' profile has no channel to change {OTHER_PROFILES}", ("nodes", i, "changes")
    return None


def resolve(profile: str, room: dict[str, Any] | None = None, node: dict[str, Any] | None = None,
            node_where: str = "room.nodes[?].channel") -> ChannelParams:
    """The parameters of one node: profile <- room-wide overrides <- the node's overrides."""
    check_profile(profile, rendered=True)
    merged = dict(PROFILES[profile])
    merged.update(check_overrides(room, "room.channel"))
    node_table = check_overrides(node, node_where)
    if "disable" in node_table and "disable" in merged:  # disabling accumulates
        node_table["disable"] = tuple(dict.fromkeys((*merged["disable"], *node_table["disable"])))
    merged.update(node_table)
    return ChannelParams(**merged).resolved()


def describe() -> list[tuple[str, str, Any]]:
    """(name, type, neutral default) of every parameter, for docs and error messages."""
    return [(f.name, str(f.type), f.default) for f in fields(ChannelParams)]


__all__ = ["ChannelParams", "PROFILES", "PROFILE_NAMES", "POSE_KEYS", "STAGES", "check_overrides", "check_profile",
           "exact_room_problem", "resolve", "describe"]
