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
from pydantic import BaseModel, ConfigDict, Field, model_validator

StreamKind = Literal["grad", "avg", "params", "sync"]
"""`grad`: a worker's gradient for the server; `avg`: the server's word on a step (its average, or empty: skipped);
`params`: the server's snapshot of the training state (protocols.snapshot);
`sync`: a node's start-up / rejoin frames (protocols.sync)."""

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


class CodeSeen(Message):
    """The FrameDecoder found a code in a capture (`seq` of its camera): the first one's bounding box (x, y,
    w, h in camera pixels) and the image, for a camera that sets its exposure on the code it films."""

    bbox: tuple[int, int, int, int]
    image: np.ndarray
    seq: int = Field(ge=0)


class SendTensor(Message):
    """Send `payload` on `stream` to the nodes named in `to`, as one acknowledged transfer (its `seq`:
    `step`) that every one of them must read; the state it belongs to (`epoch`, `base`) travels sealed
    with it (protocols.streams). Nodes that are not ranks (observers) overhear what their cameras see."""

    stream: StreamKind
    to: tuple[str, ...]
    payload: bytes
    epoch: int = Field(default=0, ge=0, le=0xFFFF)
    base: int = Field(default=0, ge=0)
    background: bool = False  # shown in the screen time the other transfers leave (protocols.planner)
    overheard: bool = False  # also read by nodes that acknowledge nothing (observers): it lingers


class FrameTiming(Message):
    """A trusted frame from `origin` was read: its clock-sync fields (protocols.frames.Timing).

    `shown` is on `origin`'s clock, `captured` on this node's own clock; the echo (if
    `echo_peer` is set) is `origin` saying when its camera caught a frame of `echo_peer`.
    """

    origin: str
    shown: float
    captured: float
    echo_peer: str | None = None
    echo_shown: float = 0.0
    echo_captured: float = 0.0
    layout: int = 0  # which layout of the ladder the frame was in


class ScheduleKnown(Message):
    """The step schedule (on the server's clock, as this node's Clock maps it) and the server's
    state: step `first_step` starts at `t0` (the steps before it at the same pace, unless this node knew
    them: a node told of the schedule after a change); `epoch` is the server's incarnation, `applied` its update count
    when it announced; `join_step` is the first step this node takes part in; `absent`: the nodes not in
    the room when the schedule became known here (the room started without them and they have not joined
    yet: a worker that joins later says hello to the server)."""

    control: ClassVar[bool] = True
    t0: float
    phases: tuple[tuple[str, float], ...]
    steps: int
    epoch: int
    applied: int
    join_step: int
    absent: tuple[str, ...] = ()
    first_step: int = 0


class ScheduleChanged(Message):
    """The server changed the step schedule while the run goes (actors/clock.py): from step `first_step` on,
    which starts at `t0`, the phases are `phases` (the layouts in use changed); the steps before it keep
    theirs (wccl.runtime.schedule.Schedule.then); the run has `steps` steps (more than it started with when
    the server made up steps it skipped)."""

    control: ClassVar[bool] = True
    first_step: int
    t0: float
    phases: tuple[tuple[str, float], ...]
    steps: int


class StepSkipped(Message):
    """The parameter server skipped `step` (fewer than its quorum of gradients came): its node's Clock makes
    the step up with one more at the run's end (actors/clock.py)."""

    control: ClassVar[bool] = True


class TensorReceived(Message):
    """A whole tensor rebuilt from frames sent by `origin`, its checksum verified."""

    origin: str
    stream: StreamKind
    payload: bytes
    frames: int = Field(ge=1)
    epoch: int = 0
    base: int = 0


class Snapshot(Message):
    """The server's training state (protocols.snapshot bytes) for the worker on its own node."""

    control: ClassVar[bool] = True
    payload: bytes


class LocalGradient(Message):
    """A worker's bf16 gradient for the parameter server of its own node."""

    payload: bytes
    loss: float
    epoch: int = 0
    base: int = 0


class AveragedGradient(Message):
    """The server's averaged bf16 gradient for the worker of its own node."""

    payload: bytes
    contributors: tuple[str, ...]
    epoch: int = 0
    base: int = 0


# ---- collectives (the torch.distributed backend, wccl.distributed; frames of protocols.transfer) ----

AckPair = tuple[int, int]
"""protocols.transfer.Ack as (cum, mask): every tid <= cum received, and cum + 2 + i for each bit i."""


class CollectiveRequest(Message):
    """A collective issued by the rank's program (wccl.distributed): the k-th of its group (`seq`).

    `inputs` are the tensor bytes this rank contributes, one per part (little endian, C order);
    `ready_at` is when, on the node's own clock, the rank's program issued it (its compute charged).
    `handle` is the backend's key to hand the result back by (`CollectiveDone`).
    Point-to-point (`op` "send" or "recv", P2P_OPS): `root` is the peer (-1: a recv from any source),
    `tag` the message's tag, and `seq` the message's number among this rank's sends to that peer with
    that tag (or, for a recv, unused): those take no part in the group's numbering.
    """

    control: ClassVar[bool] = True
    seq: int = Field(ge=0)
    op: str
    dtype: str
    numel: int = Field(ge=0)
    inputs: tuple[bytes, ...]
    root: int = 0
    reduce_op: str = "sum"  # for allreduce/reduce_scatter: how an algorithm that reduces on the way folds
    tag: int = Field(default=0, ge=0, le=0xFFFFFFFF)  # point-to-point only (a subgroup's tags above 0xFFFF)
    ready_at: float
    handle: int


P2P_OPS = ("send", "recv")


class CollectiveDone(Message):
    """A collective's outcome for the backend: every rank's parts (`parts[rank]`, in rank order), or for
    an algorithm that reduces on the way (protocols.algorithms) the `reduced` bytes ("avg" still to be
    divided), or an `error` saying why it failed (timeout, mismatch). `algorithm`: the one that ran.
    A recv's outcome: `parts` holds the message alone, and `source` is the rank that sent it."""

    seq: int
    handle: int
    parts: tuple[tuple[bytes, ...], ...] = ()
    reduced: bytes | None = None
    algorithm: str = ""
    error: str | None = None
    source: int = -1


class PostTransfer(Message):
    """Show a transfer (protocols.transfer) until every rank in `dest` acknowledges it."""

    tid: int = Field(ge=1)
    seq: int = Field(ge=0)
    op: str
    dtype: str
    numel: int = Field(ge=0)
    part: int = Field(default=0, ge=0)
    dest: int = Field(ge=0, le=0xFFFF)  # one bit a rank (0: no rank, only nodes that overhear it)
    payload: bytes
    background: bool = False  # shown in the screen time the other transfers leave (protocols.planner)
    overheard: bool = False  # also read by nodes that acknowledge nothing: it lingers once its readers have it
    priority: int = Field(default=0, ge=0)  # hops its bytes still go beyond `dest`: the most go up first

    @model_validator(mode="after")
    def _has_readers(self) -> PostTransfer:
        if not self.dest and not self.overheard:
            raise ValueError("a transfer for no rank is for nodes that overhear it only: set `overheard`")
        return self


class TransferArrived(Message):
    """A transfer rebuilt from frames whose checks passed and whose bytes match its digest."""

    origin: int
    tid: int
    seq: int
    op: str
    dtype: str
    numel: int
    part: int
    payload: bytes
    frames: int


class AcksChanged(Message):
    """This node's acknowledgements (one pair per rank) changed: every frame shows them from now on.
    `news`: what only status frames carry changed (the handshake, the discovery table), or a peer that
    reads this node shows an older row of it: status frames take turns with transfers for a few frames."""

    control: ClassVar[bool] = True
    acks: tuple[AckPair, ...]
    news: bool = False
    # The run handshake (protocols.security.Handshake): the echo of every rank's run nonce, the ranks
    # this node trusts, and whether it is still greeting (some peer not yet trusted or trusting).
    echo: tuple[int, ...] = ()
    trusts: int = 0
    greeting: bool = False
    rows: bytes = b""  # the discovery table (protocols.discovery.pack_table), shown in status frames


class LayoutChosen(Message):
    """The room's layout (its index in the start-up ladder): the room's choice (protocols.discovery), known
    to a rank in the room when the sight is, and to a rank that joins later from the room's rows. This
    node's screen shows it from now on, to each reader until that reader asks for another (`LayoutAsked`)."""

    control: ClassVar[bool] = True
    layout: int


class LayoutAsks(Message):
    """The layout this node's camera asks each rank's screen to show it its frames in, one per rank (an
    index into the start-up ladder; protocols.transfer.NO_ASK: none asked), shown in every frame from now on
    (protocols.adapt)."""

    control: ClassVar[bool] = True
    asks: tuple[int, ...]


class LayoutAsked(Message):
    """Rank `origin` asks this node's screen to show it its frames in `layout` (an index into the start-up
    ladder; protocols.adapt)."""

    control: ClassVar[bool] = True
    origin: int
    layout: int


class SightKnown(Message):
    """Every rank's row of the discovery table is final (protocols.discovery): the layout every rank uses
    from now on (its index in the start-up ladder), and which camera reads which screen in it, as (reader,
    shown, quality: the share of frames read), the same on every rank; `absent`: the ranks not in the room
    (it started without them and they have not joined); `joined`: the ranks in it that joined after it
    started. Sent again each time a rank joins."""

    control: ClassVar[bool] = True
    edges: tuple[tuple[int, int, float], ...]
    layout: int = 0
    absent: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()


class PeerAcks(Message):
    """Rank `origin`'s frames acknowledge these transfers of this node (what it has rebuilt)."""

    control: ClassVar[bool] = True
    origin: int
    ack: AckPair


class HoldsKnown(Message):
    """How many of the group's collectives each rank is known to hold (every part of it), one count
    per rank: the Collectives actor says its own, the FrameDecoder what the frames it read say (relayed
    camera to camera); every frame shows the most known (protocols.transfer)."""

    control: ClassVar[bool] = True
    holds: tuple[int, ...]


class Drain(Message):
    """The rank's program is done: show until every posted transfer is acknowledged, linger, stop."""

    control: ClassVar[bool] = True
    timeout_s: float


class VoidCollectives(Message):
    """The group changed (a rank restarted and rejoined, or joined late): the rank's program goes on from
    collective `first_seq`, and every collective before it is void (one still running ends with no
    `CollectiveDone`; each counts as held, so none holds a later one back). From `first_seq` on the
    collectives run over the ranks of `group` (a bit a rank)."""

    control: ClassVar[bool] = True
    first_seq: int = Field(ge=0)
    group: int = Field(ge=1)

