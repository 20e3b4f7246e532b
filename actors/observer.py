"""Observer: rebuilds the model from what its camera reads off the parameter server's screen.

Consumes: `TensorReceived` (from the server only, overheard: its transfers
are meant for the workers; stream `avg`, its word on one step: the averaged
gradient, or empty for a skipped step; stream `params`, a snapshot of the
server's training state, protocols.snapshot; the last one, its step one
past the last step, is the run's end state).
Emits: nothing; it logs `observer_step` after every update it applies (test
accuracy and loss on its own copy of the held-out digits, and its
predictions for the first few of them), `observer_missed_step`,
`observer_recovered`, `observer_snapshot_checked` and, at the end,
`observer_finished`.

Its replica starts from the same seed and init as the trainers' (the state of
0 updates, epoch 0) and applies the averages in order, exactly as a worker
does: when every average was read, its parameters equal the server's bit for
bit. It has no other channel: light only. Every average names the state it
applies to (the server's `epoch`, and `base`: how many updates that state
had seen). When one arrives for a later state than the replica's, an update
has not been read (yet): applying more would drift silently, so the observer
says so (`observer_missed_step`) and stops applying, keeping the averages
that come, until the one it lacks arrives after all (`observer_caught_up`:
frames are read in any order, and the server's words linger on its screen
for observers) or a snapshot lets it start again from the server's state
(then it applies the averages it kept since). A snapshot of the state it is
in is checked against its own (`observer_snapshot_checked`); one that
differs stalls it until a snapshot of a later state.

It has no schedule of its own: its run ends once it has applied the last
step's average (`steps` from config, more when the server's announcement
says it made up steps it skipped: stream `sync`) or holds the run's end state (the
final snapshot, checked against its own or taken), or when its node is
ended (the room's run is over) or stopped. A stalled observer waits until then; one that ends
before the last step's average says so (`observer_incomplete`, or
`observer_interrupted` when the run was stopped).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import structlog
import torch

from protocols import snapshot as snap
from protocols import sync
from protocols.messages import TensorReceived
from wccl.compression import Codec, CodecError, get_codec
from wccl.runtime.actor import Actor, ActorContext
from protocols.registry import REGISTRY

KEEP_AVERAGES = 64  # averages kept while stalled, to catch up after a snapshot
KEEP_DIGESTS = 64  # digests of the replica's recent states, to check the server's snapshots against


class Observer(Actor):
    consumes = (TensorReceived,)
    on_schedule = True
    ends_node = True

    def __init__(self, ctx: ActorContext, replica: Any, server: str, steps: int, show_digits: int = 8,
                 codec: Codec | None = None, stopped: Callable[[], bool] = lambda: False) -> None:
        """`stopped()`: the run was stopped (Ctrl-C): an observer that ends before the last step then says
        so, not that its camera read too little."""
        super().__init__(ctx)
        self.stopped = stopped
        self.replica = replica
        self.codec = codec or get_codec("bf16")  # the run's gradient codec: what the averages are encoded with
        self.server = server
        self.steps = steps
        self.show_digits = show_digits
        # Progress lives in the node's results, so a restarted observer carries on where it was.
        self.results = ctx.results.setdefault("observer", {
            "applied": 0, "epoch": 0, "stalled": False, "updates": 0, "missed": 0, "recovered": 0,
            "snapshots_checked": 0, "last_step": -1})
        self._averages: dict[tuple[int, int], tuple[int, bytes]] = {}  # (epoch, base) -> (step, payload)
        self._digests: dict[tuple[int, int], str] = {}  # (epoch, applied) -> digest of the replica's state then
        self._drifted = False  # stalled on a state it cannot go on from (only a snapshot helps), not on a gap

    @property
    def done(self) -> bool:
        """The last step's average is applied: nothing more will come."""
        r = self.results
        return not r["stalled"] and r["last_step"] >= self.steps - 1

    async def run(self) -> None:
        async for msg in self.ctx.inbox:
            await self.handle(msg)
            if self.done:
                break
        self._final()

    async def handle(self, msg: TensorReceived) -> None:
        if msg.origin != self.server:
            return  # a worker's gradient: not an update of the model
        structlog.contextvars.bind_contextvars(step=msg.step)
        if msg.stream == "avg":
            self._average(msg)
        elif msg.stream == "params":
            self._snapshot(msg.payload, final=msg.step >= self.steps)
        elif msg.stream == "sync":
            self._announced(msg.payload)

    def _announced(self, payload: bytes) -> None:
        """The server's announcement of the schedule (made again when it makes up steps it skipped): the run's
        last step."""
        try:
            a = sync.decode(payload)
        except sync.SyncError as e:
            self.log.warning("sync_payload_rejected", origin=self.server, error=str(e))
            return
        if isinstance(a, sync.Announce) and a.epoch >= self.results["epoch"] and a.steps > self.steps:
            self.log.info("observer_steps_made_up", steps=a.steps, was=self.steps)
            self.steps = a.steps

    # ------------------------------------------------------------------ averages
    def _average(self, msg: TensorReceived) -> None:
        r = self.results
        key = (msg.epoch, msg.base)
        if not msg.payload:  # the server skipped the step: the state stays
            if key == (r["epoch"], r["applied"]) and not r["stalled"]:
                r["last_step"] = max(r["last_step"], msg.step)
            return
        if msg.epoch == r["epoch"] and msg.base < r["applied"]:
            return  # an update this replica already has
        self._averages[key] = (msg.step, msg.payload)
        if len(self._averages) > KEEP_AVERAGES:
            del self._averages[min(self._averages)]
        if key == (r["epoch"], r["applied"]) and r["stalled"] and not self._drifted:
            # The average it lacked came after a later one (frames are read in any order): the ones kept
            # follow on from it.
            r["stalled"] = False
            r["recovered"] += 1
            self.log.info("observer_caught_up", applied=r["applied"], epoch=r["epoch"], kept=len(self._averages))
        if r["stalled"]:
            return
        if key != (r["epoch"], r["applied"]):
            r["stalled"] = True
            r["missed"] += 1
            self.log.warning("observer_missed_step", applied=r["applied"], epoch=r["epoch"],
                             average_base=msg.base, average_epoch=msg.epoch,
                             missing=max(0, msg.base - r["applied"]) if msg.epoch == r["epoch"] else None)
            return
        self._apply_kept()

    def _apply_kept(self) -> None:
        """Apply every kept average that follows on from the replica's state, in order."""
        r = self.results
        while (kept := self._averages.pop((r["epoch"], r["applied"]), None)) is not None:
            step, payload = kept
            structlog.contextvars.bind_contextvars(step=step)
            try:
                avg = self.codec.decode(payload, self.replica.numel)
            except CodecError as e:
                self.log.error("average_undecodable", error=str(e), codec=self.codec.describe())
                r["stalled"] = self._drifted = True  # never applied from a guess: a snapshot brings it back
                break
            self.replica.apply(avg)
            r["applied"] += 1
            r["updates"] += 1
            r["last_step"] = max(r["last_step"], step)
            self._remember()
            acc, loss = self.replica.evaluate()
            self.log.info("observer_step", applied=r["applied"], test_accuracy=round(acc, 4),
                          test_loss=round(loss, 4), predictions=self._predictions())
        for old in [k for k in self._averages if k[0] < r["epoch"] or (k[0] == r["epoch"] and k[1] < r["applied"])]:
            del self._averages[old]

    @torch.no_grad()
    def _predictions(self) -> list[int]:
        """The current model's classes for the first held-out digits (the dashboard shows them)."""
        model = self.replica.model
        model.eval()
        return model(self.replica.dataset.test_x[: self.show_digits]).argmax(dim=1).tolist()

    # ------------------------------------------------------------------ snapshots
    def _snapshot(self, payload: bytes, final: bool = False) -> None:
        """The server's state: recover from it when stalled or behind; otherwise check ours against it.
        `final`: the run's end state; once the replica holds it, nothing more is to come."""
        r = self.results
        try:
            s = snap.decode_snapshot(payload)
        except snap.SnapshotError as e:
            self.log.warning("observer_snapshot_unreadable", error=str(e))
            return
        if s.epoch < r["epoch"]:
            return
        if r["stalled"] and s.epoch == r["epoch"] and s.applied < r["applied"]:
            return  # stalled: only the state it is in, or a later one, helps
        if not r["stalled"] and s.epoch == r["epoch"] and s.applied <= r["applied"]:
            # A state this replica went through (a snapshot takes longer to show than an average): check it.
            if s.applied == r["applied"]:
                self._remember()
            mine = self._digests.get((s.epoch, s.applied))
            if mine is None:
                return  # too old to check
            identical = mine == s.digest()
            r["snapshots_checked"] += 1
            self.log.info("observer_snapshot_checked", applied=s.applied, identical=identical)
            if identical:
                if final and s.applied == r["applied"]:
                    r["last_step"] = self.steps - 1
                return
            if s.applied < r["applied"]:
                r["stalled"] = self._drifted = True  # drifted since then: wait for a snapshot of a later state
                return
        was = r["applied"]
        self.replica.import_state(s.arrays)
        r.update(epoch=s.epoch, applied=s.applied, stalled=False)
        self._drifted = False
        r["recovered"] += 1
        self._digests = {(s.epoch, s.applied): s.digest()}
        self.log.info("observer_recovered", applied=s.applied, epoch=s.epoch, from_applied=was, final=final)
        self._apply_kept()
        if final:
            r["last_step"] = self.steps - 1

    def _remember(self) -> None:
        r = self.results
        self._digests[(r["epoch"], r["applied"])] = snap.state_digest(self.replica.export_state())
        for old in sorted(self._digests)[:-KEEP_DIGESTS]:
            del self._digests[old]

    # ------------------------------------------------------------------ end
    def _final(self) -> None:
        r = self.results
        acc, loss = self.replica.evaluate()
        params = self.replica.parameters_flat()
        r.update(test_accuracy=acc, test_loss=loss,
                 params_sha256=hashlib.sha256(params.numpy().tobytes()).hexdigest())
        self.log.info("observer_finished", test_accuracy=round(acc, 4), applied=r["applied"], epoch=r["epoch"],
                      missed=r["missed"], recovered=r["recovered"], stalled=r["stalled"])
        if not self.done and self.stopped():
            self.log.info("observer_interrupted", last_step=r["last_step"], steps=self.steps, applied=r["applied"])
        elif not self.done:
            # Ended before the last step's average (the run is over): its model is not the trainers' last.
            self.log.warning("observer_incomplete", last_step=r["last_step"], steps=self.steps, applied=r["applied"],
                             stalled=r["stalled"], hint="its camera read too few of the server's frames: aim it at "
                             "the server's screen (python -m wccl.aim), or bring it closer")


REGISTRY.register("actor.observer", "standard", Observer)
