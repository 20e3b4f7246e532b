"""RankWorker: the built-in run's replica when every node is a rank (`[training] exchange = "collectives"`).

Consumes: `CollectiveDone` (this node's Collectives actor: every rank's
gradient, in rank order), `TensorReceived` (the "sync" stream: a restarted or
late rank's `Hello`, the lead's `Regroup`). Emits: `CollectiveRequest` (this
step's gradient, to be all-gathered), `VoidCollectives` (the group
regrouped), `SendTensor` (for observers: the step's average and snapshots;
for the group: `Hello` and `Regroup`), `Drain` (the run is over: show until
the peers have what they need, then stop the node).

There is no parameter server and no step schedule: each step every rank
computes its gradient, encodes it with the run's codec through its own error
feedback (as a worker of the server's run does), and all-gathers the bytes
over the light by the algorithm the room's sight graph fits (ring, tree,
all-see-all or star: protocols.algorithms, chosen by the cost model, logged
`algorithm_chosen`). Every rank then does what the server does: decodes the
gradients, leaves out the non-finite, averages the rest in float32 in
sorted-name order and encodes the average with its downlink error feedback
(wccl.training.exchange.reduce). The downlink residuals start equal and are
fed the same bytes, so every rank applies the same bits: the same result as
the server's run with the same workers, bit for bit.

The collectives' agreement (actors/collectives.py) hands a step's gradients
on only once every rank holds them, so a step is applied by every rank or by
none; a step that fails (a camera dark past `[collectives] timeout_s`)
fails every rank's node with the reason, never a replica that differs.

Observers (nodes that only listen, actors/observer.py) watch one rank's
screen: the room's node with the `server` role (`shows_observers`). That
rank shows, for them only (no rank reads it: protocols.transfer names the
sender as its reader), each step's word as the parameter server's run does:
the encoded average every rank applied (empty for a skipped step) with the
state it applies to (`base`: updates applied before it), and a snapshot of
its training state every `snapshot_every` steps and after the last one
(`final`, its step one past the last; protocols.snapshot); they
linger for observers in the screen time the collectives leave and while
they wait for acknowledgements (protocols.planner).
An observer then rebuilds the ranks' model bit for bit, or says what it
missed.

Checkpoints: every `checkpoint_every` applied steps each rank writes its
training state to its own disk (wccl.runtime.recovery, tagged under the room key),
keeping the one before too. A run started with `resume` (every rank at
once, after the room stopped) first all-gathers which checkpoints each rank
has (the step each continues from and its state's digest) as its
collective #0, takes the latest step that every rank holds with one state,
loads it and trains on from there: the same bits as a run never stopped
(codecs with error feedback start their residuals again at zero). Ranks
with no state in common stop, saying what each holds.

A rank whose laptop restarts mid-run rejoins: its fresh node takes its row
of the room's sight from the others' frames (discovery's `adopted`), and its
RankWorker, knowing it starts late, shows a `Hello` to the lead (the rank
with the `server` role) and waits. Meanwhile the other ranks wait in the
step's collective for the restarted rank's part (up to `[collectives]
timeout_s`). The lead answers with a `Regroup` (protocols.sync) to every
other rank: the collectives before a number past any yet issued are void
(`VoidCollectives`); that collective is the lead's broadcast of its state,
and every rank goes on from the step the lead was exchanging, with that
state, error feedback started again at zero.
Every rank takes the lead's state (a rank that had applied the step the lead
had not goes back to the lead's), so the replicas stay identical; the
restarted rank's lost work is redone. A restarted lead cannot be answered
(its state went with it): it stops, saying to resume every rank from its
checkpoints. A RankWorker that fails is not restarted in place: its node
fails, saying why.

A room may start without some ranks (`[room] wait_for_nodes_s`, `[training]
quorum`): the collectives then run over the ranks it started with (the
group), each step averaging their gradients. A rank that starts later, once
discovery let it into the room, says hello as a restarted rank does. The
step then running does not wait for it, so the lead lets that step finish
and regroups before the next: its Regroup names the group with the
newcomer, and every rank goes on from the lead's state (that step applied)
with the newcomer's gradients averaged in.

Compute is charged to the node's clock as in wccl.distributed: a step's
gradient goes up when a laptop that computes as fast as this machine would
have it (its CPU time times `[collectives] compute_scale`). Evaluating on the
test digits is for the logs and is not charged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import struct
import time
from pathlib import Path
from typing import Any

import torch

from protocols import snapshot as snap
from protocols import sync
from wccl.compression import Codec, ErrorFeedback
from protocols.messages import (CollectiveDone, CollectiveRequest, Drain, SendTensor, TensorReceived,
                                VoidCollectives)
from protocols.security import NO_KEY, RoomKey
from wccl.runtime.actor import Actor, ActorContext, GiveUp, Overflow
from protocols.registry import REGISTRY
from wccl.runtime.recovery import CheckpointError, load_checkpoint, save_checkpoint
from wccl.training.divergence import HINT, DivergenceWatch
from wccl.training.exchange import reduce

_HELD = struct.Struct(">I8s")  # a checkpoint a rank holds: the step it continues from, its state's digest
NO_STEP = 0xFFFFFFFF
KEEP_CHECKPOINTS = 2  # the latest and the one before: the ranks agree on one every rank holds
GROUP_SPAN = 1 << 20  # a regroup's first collective: the next multiple of this, past any collective yet issued


class _Regrouped(Exception):
    """The group regrouped: go on from training step `step`."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.step = step


class RankWorker(Actor):
    consumes = (CollectiveDone, TensorReceived)
    mailbox = (16, Overflow.BLOCK)

    def __init__(self, ctx: ActorContext, replica: Any, codec: Codec, names: list[str], steps: int,
                 greeted: asyncio.Event, greet_problem, greet_timeout_s: float, quorum: int = 1,
                 eval_every: int = 1, compute_scale: float = 1.0, drain_s: float = 10.0,
                 shows_observers: bool = False, snapshot_every: int = 10, checkpoint: Path | None = None,
                 checkpoint_every: int = 0, resume: bool = False, session: int = 0, key: RoomKey = NO_KEY,
                 lead: str = "", joining=lambda: False, start_group=None) -> None:
        """`names`: the ranks in rank order; `greeted`: set once the run handshake and discovery are done
        (`greet_problem(greet_timeout_s)` says what is missing if they are not within `greet_timeout_s` room
        seconds); `lead`: the rank that answers a restarted or late rank (the room's `server` role);
        `joining()`: true once greeted if the others ran before this node started (it started again, or joined
        a room that started without it); `start_group()`: the ranks the room started with, once greeted (a bit a rank; None: every
        rank); `shows_observers`: this rank shows the room's observers each step's average and a snapshot
        every `snapshot_every` steps; `checkpoint`: this rank's checkpoint file, written every
        `checkpoint_every` applied steps (0: never) and read back with `resume`."""
        super().__init__(ctx)
        self.replica = replica
        self.codec = codec
        self.names = names
        self.steps = steps
        self.greeted = greeted
        self.greet_problem = greet_problem
        self.greet_timeout_s = greet_timeout_s
        self.quorum = quorum
        self.eval_every = eval_every
        self.compute_scale = compute_scale
        self.drain_s = drain_s
        self.shows_observers = shows_observers
        self.snapshot_every = snapshot_every
        self.checkpoint, self.checkpoint_every, self.resume = checkpoint, checkpoint_every, resume
        self.session, self.key = session, key
        self._seq = 0  # the group's next collective: #0 is the resume agreement when resuming
        self.lead = lead or names[0]
        self.joining = joining
        self.start_group = start_group
        self._group = (1 << len(names)) - 1  # the ranks whose gradients the collectives gather (a bit a rank)
        self._group_from = 0  # the group's first collective since it last regrouped
        self._hellos: list[str] = []  # ranks that started again and wait for the lead's answer
        # Node-clock time up to which this rank's compute is charged. Virtual time stands still while it
        # computes (the mark moves on by the CPU time); real time moves by itself (the mark is then behind).
        self._mark = 0.0
        self.numel = replica.numel
        self.uplink = ErrorFeedback(codec)  # what this rank's codec left out of its gradient
        self.downlink = ErrorFeedback(codec)  # the average's: alike on every rank
        self.watch = DivergenceWatch()
        self.results = ctx.results.setdefault("worker", {"applied": 0, "skipped": 0, "bytes_sent": 0,
                                                         "gradient_nonfinite": 0, "gradient_undecodable": 0,
                                                         "algorithms": {}, "shown_to_observers": 0,
                                                         "checkpoints": 0, "regroups": 0})

    async def run(self) -> None:
        try:
            await self._train()
        except GiveUp:
            raise
        except Exception as e:
            # A fresh RankWorker could not take over: its replica and the group's collective numbers have
            # moved on. The node fails, saying why, rather than train from a state the others do not share.
            raise GiveUp(f"the rank's training failed ({e!r}); a rank cannot rejoin its collectives midway") from e

    async def _train(self) -> None:
        try:
            await asyncio.wait_for(self.greeted.wait(), self.greet_timeout_s)
        except TimeoutError:
            raise GiveUp(self.greet_problem(self.greet_timeout_s)) from None
        if self.start_group is not None:
            self._group = self.start_group()
        without = self._members(~self._group)
        self.log.info("rank_ready", ranks=len(self.names), steps=self.steps, codec=self.codec.describe(),
                      **({"started_without": without} if without else {}))
        self._mark = self.clock.now()
        step: int | None = None  # the step to train next (None: not known yet)
        while step is None or step < self.steps:
            try:
                if step is None:
                    if self.joining():
                        await self._adopt(await self._join())  # (goes on by raising _Regrouped)
                    step = await self._resume() if self.resume else 0
                    continue
                if self._hellos:
                    await self._regroup(step)  # (goes on by raising _Regrouped)
                await self._step(step)
                step += 1
            except _Regrouped as r:
                step = r.step
        self._final()
        await self.emit(Drain(sender=self.ctx.node, time=self.clock.now(), timeout_s=self.drain_s))

    async def _step(self, step: int) -> None:
        """Train one step (its compute charged up to `_mark`)."""
        start, cpu0 = max(self._mark, self.clock.now()), time.thread_time()
        grad, loss = self.replica.compute_gradient(step, raw=True)
        payload, _ = self.uplink.encode(grad)
        self._mark = start + (time.thread_time() - cpu0) * self.compute_scale
        self.results["bytes_sent"] += len(payload)
        why = self.watch.observe(loss)
        if why is not None:
            self.results["diverging"] = why
            self.log.warning("training_diverging", reason=why, hint=HINT, codec=self.codec.describe())
        done = await self._exchange(f"step {step}: the gradient exchange", payload,
                                    max(self._mark, self.clock.now()), step)
        start, cpu0 = max(self._mark, self.clock.now()), time.thread_time()
        base = self.results["applied"]
        fields, word = self._apply(step, done)
        self._mark = start + (time.thread_time() - cpu0) * self.compute_scale
        if self.shows_observers:
            await self._show_observers(step, base, word)
        if fields is not None and self.checkpoint is not None and self.checkpoint_every \
                and self.results["applied"] % self.checkpoint_every == 0:
            self._save(step + 1)
        if fields is None:
            return
        if self.eval_every and (step + 1) % self.eval_every == 0:
            acc, test_loss = self.replica.evaluate()  # for the logs: not charged
            fields.update(test_accuracy=round(acc, 4), test_loss=round(test_loss, 4))
        self.log.info("step_applied", step=step, loss=round(loss, 4), **fields)

    async def _exchange(self, what: str, payload: bytes, ready_at: float, step: int | None = None,
                        op: str = "allgather", root: int = 0) -> CollectiveDone:
        """All-gather `payload` (or broadcast it from rank `root`) as the group's next collective; every rank's
        bytes (a broadcast: the root's in every slot), or GiveUp saying `what` failed. The lead's Regroup
        voids it instead (_Regrouped), and so does, at the lead during training step `step`, the Hello of a
        restarted member of the group, whose part the collective waits for. A rank that joins late has no part
        in it: the lead regroups for it once the step is done (in the run's last step, at once)."""
        seq, self._seq = self._seq, self._seq + 1
        await self.emit(CollectiveRequest(sender=self.ctx.node, time=self.clock.now(), seq=seq, op=op,
                                          dtype="uint8", numel=len(payload), inputs=(payload,), root=root,
                                          ready_at=ready_at, handle=seq))
        while True:
            if step is not None and self._hellos and (step == self.steps - 1 or self._awaited(self._hellos)):
                await self._regroup(step)
            msg = await self.ctx.inbox.get()
            if isinstance(msg, TensorReceived):
                regroup = self._heard(msg)
                if regroup is not None:
                    await self._adopt(regroup)
                continue
            if isinstance(msg, CollectiveDone) and msg.seq < self._group_from <= seq:
                continue  # a collective the group voided, ended before the void reached this node's Collectives
            break
        if not isinstance(msg, CollectiveDone) or msg.seq != seq:
            raise GiveUp(f"{what}: expected collective #{seq}, got {type(msg).__name__} #{getattr(msg, 'seq', '?')}")
        if msg.error is not None:
            raise GiveUp(f"{what} failed on every rank: {msg.error}")
        return msg

    # -- a rank that started again ------------------------------------------------------------------
    def _heard(self, msg: TensorReceived) -> sync.Regroup | None:
        """A "sync" payload from a peer: a Hello (kept, at the lead, to answer in the step's exchange), or the
        lead's Regroup to go on from (returned, if it is newer than this rank's group)."""
        if msg.stream != "sync":
            return None
        try:
            payload = sync.decode(msg.payload)
        except sync.SyncError as e:
            self.log.warning("sync_unreadable", origin=msg.origin, error=str(e))
            return None
        if isinstance(payload, sync.Hello) and payload.wants_snapshot and self.ctx.node == self.lead:
            self.log.info("rank_rejoining", peer=msg.origin)
            if msg.origin not in self._hellos:
                self._hellos.append(msg.origin)
        elif isinstance(payload, sync.Regroup) and msg.origin == self.lead and payload.first_seq > self._group_from:
            return payload
        return None

    async def _join(self) -> sync.Regroup:
        """This node started again while the others trained: ask the lead to regroup; its answer."""
        if self.ctx.node == self.lead:
            raise GiveUp("this rank leads the group (the room's server role) and started again while the others "
                         "ran: its state went with it. Stop every rank and start them again with --resume "
                         "(each goes on from its latest checkpoint, [recovery] checkpoint_every)")
        self.log.info("joining_late", lead=self.lead)
        hello = sync.Hello(wants_snapshot=True, applied=-1, epoch=0).encode()
        await self.emit(SendTensor(sender=self.ctx.node, time=self.clock.now(), step=0, stream="sync",
                                   to=(self.lead,), payload=hello))
        try:
            async with asyncio.timeout(self.greet_timeout_s):
                while True:
                    msg = await self.ctx.inbox.get()
                    if isinstance(msg, TensorReceived) and (regroup := self._heard(msg)) is not None:
                        break
        except TimeoutError:
            raise GiveUp(f"joining late: {self.lead}, who leads the group, did not answer within "
                         f"{self.greet_timeout_s:g} s (is there a chain of laptops that read each other's screens "
                         "from this one to it?)") from None
        return regroup

    def _awaited(self, names: list[str]) -> bool:
        """Whether one of `names` is in the group: its collectives wait for that rank's part."""
        return bool(set(names) & set(self._members()))

    def _members(self, group: int | None = None) -> list[str]:
        group = self._group if group is None else group
        return [n for r, n in enumerate(self.names) if group >> r & 1]

    async def _regroup(self, step: int) -> None:
        """At the lead, for the ranks that started again or joined late: tell every other rank to void the
        group's collectives so far and go on from `step` with the joiners in the group (`Regroup`), then
        broadcast this rank's state to them as the first collective after the void."""
        joiners, self._hellos = self._hellos, []
        group = self._group | sum(1 << self.names.index(n) for n in joiners if n in self.names)
        first = (self._seq // GROUP_SPAN + 1) * GROUP_SPAN  # past any collective a rank may have issued
        applied = self.results["applied"]
        start, cpu0 = max(self._mark, self.clock.now()), time.thread_time()
        state = snap.encode_snapshot(snap.Snapshot(applied, 0, self.replica.export_state()))
        self._mark = start + (time.thread_time() - cpu0) * self.compute_scale
        others = tuple(n for n in self.names if n != self.ctx.node)
        self.log.info("group_regrouped", joined=joiners, step=step, applied=applied, first_collective=first,
                      bytes=len(state), group=self._members(group))
        await self.emit(SendTensor(sender=self.ctx.node, time=self.clock.now(), step=step, stream="sync", to=others,
                                   payload=sync.Regroup(first, step, len(state), group).encode()))
        await self._go_on(first, step, state, group)

    async def _adopt(self, regroup: sync.Regroup) -> None:
        """The lead's Regroup: void the group's collectives so far, take the lead's state (broadcast as the
        first collective after the void), go on from its step."""
        await self._go_on(regroup.first_seq, regroup.step, bytes(regroup.state_bytes), regroup.group)

    async def _go_on(self, first: int, step: int, state: bytes, group: int) -> None:
        """Void the collectives before `first`, start error feedback again, take the lead's state (`state` at
        the lead) from collective `first` on with the ranks of `group`, and go on from `step` (_Regrouped)."""
        self._seq = self._group_from = first
        self._group = group
        await self.emit(VoidCollectives(sender=self.ctx.node, time=self.clock.now(), first_seq=first, group=group))
        self.uplink.reset()
        self.downlink.reset()
        lead = self.names.index(self.lead)
        done = await self._exchange("regrouping: the lead's state", state, max(self._mark, self.clock.now()),
                                    op="broadcast", root=lead)
        if self.ctx.node != self.lead:
            start, cpu0 = self.clock.now(), time.thread_time()
            try:
                got = snap.decode_snapshot(b"".join(done.parts[lead]))
            except snap.SnapshotError as e:
                raise GiveUp(f"regrouping: the lead's state is not usable ({e})") from None
            was = self.results["applied"]
            self.replica.import_state(got.arrays)
            self._mark = start + (time.thread_time() - cpu0) * self.compute_scale
            self.results["applied"] = got.applied
            self.log.info("snapshot_adopted", reason="regroup", via="light", lead=self.lead, step=step,
                          snapshot_applied=got.applied, applied_before=was, first_collective=first)
        self.results["regroups"] += 1
        raise _Regrouped(step)

    def _paths(self) -> list[Path]:
        """This rank's checkpoint files: the latest, then the one before."""
        assert self.checkpoint is not None
        return [self.checkpoint, self.checkpoint.with_name(f"{self.checkpoint.name}.1")]

    def _save(self, next_step: int) -> None:
        """Write the state after `next_step` steps (the latest checkpoint; the one before is kept)."""
        latest, before = self._paths()
        with contextlib.suppress(FileNotFoundError):  # (none yet: the first checkpoint of the run)
            latest.replace(before)
        state = snap.Snapshot(self.results["applied"], 0, self.replica.export_state())
        save_checkpoint(latest, dict(session=self.session, node=self.ctx.node, step=next_step), state,
                        bytes(torch.get_rng_state().numpy()), self.key)
        self.results["checkpoints"] += 1
        self.log.info("checkpoint_written", step=next_step, applied=state.applied, path=str(latest))

    async def _resume(self) -> int:
        """Agree with every rank on a checkpoint all of them hold (collective #0) and load it: the step to
        train on from."""
        if self.checkpoint is None:
            raise GiveUp("recovery.resume: this rank has no checkpoint file to resume from")
        held: dict[int, tuple[str, tuple]] = {}  # step -> (state digest, the loaded checkpoint)
        for path in self._paths():
            try:
                meta, state, rng = load_checkpoint(path, self.session, self.key)
            except CheckpointError as e:
                if path.exists() and self.key.source == "ephemeral":
                    e = CheckpointError(f"{e}: this simulated room names no key, so each run draws its own; "
                                        "name one (room.key_file) in runs that are to be resumed")
                self.log.warning("checkpoint_unusable", path=str(path), reason=str(e))
                continue
            held.setdefault(int(meta["step"]), (state.digest(), (meta, state, rng)))
        mine = sorted(held, reverse=True)[:KEEP_CHECKPOINTS]
        entries = [(s, bytes.fromhex(held[s][0])) for s in mine]
        entries += [(NO_STEP, bytes(8))] * (KEEP_CHECKPOINTS - len(entries))
        payload = b"".join(_HELD.pack(*e) for e in entries)
        done = await self._exchange("recovery.resume: agreeing on a checkpoint", payload, self.clock.now())
        each = []
        for parts in (p for r, p in enumerate(done.parts) if self._group >> r & 1):
            data = b"".join(parts)
            each.append({s: d.hex() for s, d in (_HELD.unpack_from(data, k * _HELD.size)
                                                   for k in range(KEEP_CHECKPOINTS)) if s != NO_STEP})
        common = [s for s in each[0] if all(e.get(s) == each[0][s] for e in each)]
        if not common:
            holds = "; ".join(f"{n}: {', '.join(f'step {s}' for s in sorted(e)) or 'none'}"
                              for n, e in zip(self._members(), each))
            raise GiveUp(f"recovery.resume: the ranks hold no checkpoint of one state in common ({holds}); "
                         "start the run again without --resume")
        step = max(common)
        _, state, rng = held[step][1]
        self.replica.import_state(state.arrays)
        torch.set_rng_state(torch.frombuffer(bytearray(rng), dtype=torch.uint8))
        self.results["applied"] = state.applied
        self.results["resumed_at"] = step
        self.log.info("rank_resumed", step=step, applied=state.applied, digest=held[step][0])
        return step

    async def _show_observers(self, step: int, base: int, word: bytes) -> None:
        """The step's word (the encoded average applied to the state of `base` updates; empty: skipped) and,
        every `snapshot_every` steps and after the last, the state after it: for observers only (no rank reads
        them). The last step's snapshot goes as step `steps` (one past the last): the run's end state."""
        fields = dict(sender=self.ctx.node, time=self.clock.now(), step=step, to=(), epoch=0, overheard=True)
        await self.emit(SendTensor(**fields, stream="avg", payload=word, base=base))
        self.results["shown_to_observers"] += 1
        final = step + 1 >= self.steps
        if final or (step + 1) % self.snapshot_every == 0:
            applied = self.results["applied"]
            state = snap.encode_snapshot(snap.Snapshot(applied, 0, self.replica.export_state()))
            self.log.info("snapshot_shown", reason="final" if final else "periodic", applied=applied, epoch=0,
                          bytes=len(state), to=[])
            fields["step"] = step + 1 if final else step
            await self.emit(SendTensor(**fields, stream="params", payload=state, base=applied, background=not final))

    def _apply(self, step: int, done: CollectiveDone) -> tuple[dict[str, Any] | None, bytes]:
        """Reduce every rank's gradient and apply the average: (what to log, or None if nothing was; the
        encoded average, empty if the step was skipped)."""
        algos = self.results["algorithms"]
        algos[done.algorithm] = algos.get(done.algorithm, 0) + 1
        payloads = {self.names[r]: b"".join(parts) for r, parts in enumerate(done.parts) if self._group >> r & 1}
        red = reduce(self.codec, payloads, self.numel, self.downlink, self.quorum)
        for key, names in (("gradient_nonfinite", red.nonfinite), ("gradient_undecodable", red.undecodable)):
            if names:
                self.results[key] += len(names)
                self.log.warning(key, step=step, left_out=names)
        if red.average is None:
            self.results["skipped"] += 1
            self.log.warning("step_skipped", step=step, usable=len(red.used), quorum=self.quorum)
            return None, b""
        self.replica.apply(red.average)
        self.results["applied"] += 1
        return dict(applied=self.results["applied"], algorithm=done.algorithm, averaged=len(red.used)), red.payload

    def _final(self) -> None:
        acc, test_loss = self.replica.evaluate()
        params = self.replica.parameters_flat()
        self.results.update(test_accuracy=acc, test_loss=test_loss, state_applied=self.results["applied"],
                            params_sha256=hashlib.sha256(params.numpy().tobytes()).hexdigest())
        self.log.info("worker_finished", test_accuracy=round(acc, 4), applied=self.results["applied"],
                      skipped=self.results["skipped"])


REGISTRY.register("actor.rank_worker", "standard", RankWorker)
