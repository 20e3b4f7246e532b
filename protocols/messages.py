"""Typed messages exchanged between actors of one node.

Every message is a frozen pydantic model (`extra="forbid"`) carrying the
node that created it (`sender`), the training step it belongs to (`step`,
-1 when it belongs to none) and the node-clock time at which it was made
(`time`). Image payloads stay numpy arrays (no copies, no validation of
pixels); tensor payloads travel as the bytes that go on the wire.

Control messages (`control = True`) never wait behind data in a mailbox.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

StreamKind = Literal["grad", "avg"]
"""`grad`: a worker's gradient for the server; `avg`: the server's averaged gradient."""

PhaseName = str


class Message(BaseModel):
    """Base of every message: who made it, for which step, and when."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
    control: ClassVar[bool] = False

    sender: str
    step: int = -1
    time: float


class Tick(Message):
    """The schedule entered `phase` of `step`; it lasts from `start` to `end` (node clock)."""

    control: ClassVar[bool] = True
    phase: PhaseName
    start: float
    end: float


class ScheduleDone(Message):
    """The schedule ran all its steps (or was stopped); consumers finish up."""

    control: ClassVar[bool] = True
    steps: int
    reason: Literal["completed", "stopped"] = "completed"


class Capture(Message):
    """One camera image. `image` is HxWx3 uint8 BGR; `seq` counts captures of this camera."""

    image: np.ndarray
    seq: int = Field(ge=0)
    dropped_before: int = Field(default=0, ge=0)


class Show(Message):
    """Ask the ScreenWriter to show `payload` as frames from `start` to `end` (node clock)."""

    stream: StreamKind
    payload: bytes
    start: float
    end: float


class TensorReceived(Message):
    """A whole tensor rebuilt from frames sent by `origin`, its checksum verified."""

    origin: str
    stream: StreamKind
    payload: bytes
    frames: int = Field(ge=1)


class LocalGradient(Message):
    """A worker's bf16 gradient for the parameter server of its own node."""

    payload: bytes
    loss: float


class AveragedGradient(Message):
    """The server's averaged bf16 gradient for the worker of its own node."""

    payload: bytes
    contributors: tuple[str, ...]


ALL_MESSAGES: tuple[type[Message], ...] = (
    Tick,
    ScheduleDone,
    Capture,
    Show,
    TensorReceived,
    LocalGradient,
    AveragedGradient,
)
