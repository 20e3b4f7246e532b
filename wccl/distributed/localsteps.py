"""Local steps (DiLoCo): H optimizer steps on each rank's own data, then one compressed exchange.

    sync = LocalSteps(model, codec="topk_ef", sync_every=50, outer_lr=0.7, outer_momentum=0.9)
    for batch in data:
        loss(model, batch).backward(); inner_opt.step(); inner_opt.zero_grad()
        sync.step()        # every H-th call: exchange the change of the parameters, apply the outer step
    sync.finish()          # after the last step: every replica the same (the steps since the last sync)

The outer gradient of a rank is `global - local` (how far its H inner steps
moved the parameters). Each rank encodes its own (with error feedback where
the codec has it), all ranks exchange the bytes with one all_gather, and
every rank decodes all of them, averages them in rank order and applies the
outer optimizer (SGD with Nesterov momentum) to the global parameters, which
then replace the local ones. The global parameters, the outer momentum and
the decoded averages are the same bits on every rank: replicas agree after
every sync. The inner optimizer's state stays local, as in DiLoCo.

Any extra float64 values a rank passes to `sync(extras=...)` travel with its
bytes (e.g. its clock, so that all ranks take the same decision to stop).
With a `clock` (the room's time, or CPU time), `wait_s` and `codec_s` add up
the time spent waiting for exchanges and encoding and decoding changes; the
rest of a rank's time is its inner steps.

With `overlap=True` a round's exchange travels while the next round's inner
steps compute (Streaming DiLoCo's overlap, a whole round long): at the end of
round r a rank sends its change over round r and does not wait for it; it
waits instead for round r-1's exchange, sent a round ago, applies that outer
step to the global parameters (one round late), and goes on from them plus
its own change over round r (not averaged yet). The global parameters and
the outer momentum are still the same bits on every rank; each rank's local
parameters differ by its own latest round until `finish()`, which applies
the exchange in flight and syncs what is left, so that every replica ends
the same. A sync's result (extras included) is then the previous round's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from wccl.compression import Codec, ErrorFeedback, get_codec
from wccl.distributed.hooks import average_decoded, exchange

__all__ = ["LocalSteps", "SyncResult"]


@dataclass
class SyncResult:
    sync: int  # how many syncs so far, this one included
    bytes_sent: int  # encoded bytes this rank sent in this sync (payload, before framing)
    extras: list[list[float]]  # every rank's extras, in rank order


class LocalSteps:
    def __init__(self, model: torch.nn.Module, codec: str | Codec = "bf16", sync_every: int = 1,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, nesterov: bool = True,
                 group=None, drift_correction: bool = False, ema: float = 0.0, overlap: bool = False,
                 clock: Callable[[], float] | None = None, **codec_params: object) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        if overlap and drift_correction:
            raise ValueError("drift_correction needs each round's average before the next round: not with overlap")
        self.model, self.group = model, group
        self.codec = get_codec(codec, **codec_params) if isinstance(codec, str) else codec
        self.sync_every, self.outer_lr, self.momentum, self.nesterov = sync_every, outer_lr, outer_momentum, nesterov
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.global_params = self._flat().clone()
        self.velocity = torch.zeros_like(self.global_params)
        self.feedback = ErrorFeedback(self.codec)
        self.drift_correction = drift_correction
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"ema must be in [0, 1), got {ema}")
        self.ema = ema
        self.averaged = self.global_params.clone()  # an exponential average of the global parameters over syncs
        self._correction: list[torch.Tensor] | None = None  # per inner step: mean move of all - own mean move
        self.steps = 0
        self.syncs = 0
        self.bytes_sent = 0
        self.overlap = overlap
        self._anchor = self.global_params.clone()  # where this rank's current round started (overlap)
        self._pending: tuple | None = None  # (future, data bytes, extras bytes) of the exchange in flight
        # Where this rank's time went (with `clock`, e.g. the room's time: wccl.distributed.sim_seconds):
        # waiting for exchanges, and encoding and decoding the changes
        self.clock = clock
        self.wait_s = 0.0
        self.codec_s = 0.0
        if dist.is_available() and dist.is_initialized():
            self._check_same_start()

    def _now(self) -> float:
        return self.clock() if self.clock is not None else 0.0

    def _check_same_start(self) -> None:
        """Every rank must start from the same parameters (same model, same seed): 32 bytes to compare."""
        import hashlib

        digest = hashlib.sha256(self.global_params.numpy().tobytes()).digest()
        parts = exchange(digest, self.group).wait()
        differ = [r for r, d in enumerate(parts) if d != parts[0]]
        if differ:
            raise RuntimeError(f"LocalSteps: rank(s) {differ} start from other parameters than rank 0 "
                               "(build the model from the same seed on every rank)")

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in self.params])

    def load_averaged(self, model: torch.nn.Module) -> None:
        """Put the averaged parameters (`ema`) into `model` (a copy of the trained model, e.g. to evaluate)."""
        self._load(self.averaged, [p for p in model.parameters() if p.requires_grad])

    def load_global(self, model: torch.nn.Module) -> None:
        """Put the global parameters (the same on every rank) into `model` (a copy, e.g. to evaluate)."""
        self._load(self.global_params, [p for p in model.parameters() if p.requires_grad])

    def _load(self, flat: torch.Tensor, params: list[torch.Tensor] | None = None) -> None:
        i = 0
        with torch.no_grad():
            for p in (self.params if params is None else params):
                n = p.numel()
                p.copy_(flat[i:i + n].view_as(p).to(p.dtype))
                i += n

    def step(self, extras: list[float] | None = None) -> SyncResult | None:
        """Count one inner step; on every `sync_every`-th, sync and return what it did."""
        if self._correction is not None:
            with torch.no_grad():
                for p, c in zip(self.params, self._correction):
                    p.add_(c)
        self.steps += 1
        if self.steps % self.sync_every:
            return None
        return self.sync(extras)

    def sync(self, extras: list[float] | None = None) -> SyncResult | None:
        """Exchange this round's change and apply the outer step (with `overlap`, the previous round's:
        None at the first sync)."""
        if self.overlap:
            return self._sync_overlapped(extras)
        return self._sync(extras)

    def finish(self, extras: list[float] | None = None) -> SyncResult | None:
        """Bring every replica to the same parameters: with `overlap`, apply the exchange in flight, then
        sync the inner steps made since it was sent (if any); without, sync the inner steps since the last
        sync (if any). Returns the last sync's result (None: nothing to do)."""
        if not self.overlap:
            return self._sync(extras) if self.steps % self.sync_every else None
        last = None
        if self._pending is not None:
            last, self._pending = self._apply(*self._pending), None
        if self.steps % self.sync_every:  # (the same count on every rank: the same collectives)
            last = self._sync(extras, start=self._anchor)
        self._load(self.global_params)
        self._anchor = self.global_params.clone()
        return last

    def _send(self, start: torch.Tensor, extras: list[float] | None) -> tuple:
        """Encode this rank's change since `start` and start its exchange: (future, data bytes, extras
        bytes, the change as sent)."""
        t0 = self._now()
        data, own = self.feedback.encode(start - self._flat())
        self.codec_s += self._now() - t0
        tail = np.asarray(list(extras or []), dtype="<f8").tobytes()
        return exchange(data + tail, self.group), len(data), len(tail), own

    def _sync_overlapped(self, extras: list[float] | None) -> SyncResult | None:
        fut, n_data, n_tail, _ = self._send(self._anchor, extras)
        change = self._anchor - self._flat()  # this rank's own change over the round, as it made it
        result = self._apply(*self._pending) if self._pending is not None else None
        self._pending = (fut, n_data, n_tail)
        local = self.global_params - change
        self._load(local)
        self._anchor = local
        return result

    def _apply(self, fut, n_data: int, n_tail: int, own: torch.Tensor | None = None) -> SyncResult:
        """Wait for an exchange and apply its outer step to the global parameters."""
        t0 = self._now()
        parts = fut.wait()
        t1 = self._now()
        n = self.global_params.numel()
        if any(len(p) != n_data + n_tail for p in parts):
            raise RuntimeError("LocalSteps: ranks sent syncs of different sizes (different models, codecs or extras)")
        avg = average_decoded(self.codec, [p[:n_data] for p in parts], n)
        self.wait_s += t1 - t0
        self.codec_s += self._now() - t1
        if self.drift_correction and own is not None:
            # SCAFFOLD-like, in the update space and without extra bytes: each inner step of the next round
            # also moves by (the ranks' mean move per step - this rank's own), so a rank whose data pulls
            # elsewhere (e.g. other classes) follows the common direction. Local only: the global
            # parameters, the same on every rank, do not depend on it.
            corr = (own - avg) / self.sync_every  # own as decoded: what the codec dropped is fed back already
            self._correction, i = [], 0
            for p in self.params:
                self._correction.append(corr[i:i + p.numel()].view_as(p).to(p.dtype))
                i += p.numel()
        # SGD with (Nesterov) momentum, as torch.optim.SGD computes it (dampening 0)
        self.velocity.mul_(self.momentum).add_(avg)
        update = avg + self.momentum * self.velocity if self.nesterov else self.velocity
        self.global_params.sub_(self.outer_lr * update)
        self.averaged.mul_(self.ema).add_((1.0 - self.ema) * self.global_params)
        self.syncs += 1
        self.bytes_sent += n_data
        got = [np.frombuffer(p[n_data:], dtype="<f8").tolist() for p in parts]
        return SyncResult(self.syncs, n_data, got)

    def _sync(self, extras: list[float] | None, start: torch.Tensor | None = None) -> SyncResult:
        """One exchange, waited for; every rank then takes the global parameters."""
        fut, n_data, n_tail, own = self._send(self.global_params if start is None else start, extras)
        result = self._apply(fut, n_data, n_tail, own)
        self._load(self.global_params)
        return result
