"""Local steps (DiLoCo): H optimizer steps on each rank's own data, then one compressed exchange.

    sync = LocalSteps(model, codec="topk_ef", sync_every=50, outer_lr=0.7, outer_momentum=0.9)
    for batch in data:
        loss(model, batch).backward(); inner_opt.step(); inner_opt.zero_grad()
        sync.step()        # every H-th call: exchange the change of the parameters, apply the outer step

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
"""

from __future__ import annotations

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
                 group=None, drift_correction: bool = False, ema: float = 0.0, **codec_params: object) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
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
        if dist.is_available() and dist.is_initialized():
            self._check_same_start()

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

    def sync(self, extras: list[float] | None = None) -> SyncResult:
        extras = list(extras or [])
        outer_grad = self.global_params - self._flat()
        data, own = self.feedback.encode(outer_grad)
        tail = np.asarray(extras, dtype="<f8").tobytes()
        parts = exchange(data + tail, self.group).wait()
        n = self.global_params.numel()
        if any(len(p) != len(data) + len(tail) for p in parts):
            raise RuntimeError("LocalSteps: ranks sent syncs of different sizes (different models, codecs or extras)")
        avg = average_decoded(self.codec, [p[:len(data)] for p in parts], n)
        if self.drift_correction:
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
        self._load(self.global_params)
        self.syncs += 1
        self.bytes_sent += len(data)
        got = [np.frombuffer(p[len(data):], dtype="<f8").tolist() for p in parts]
        return SyncResult(self.syncs, len(data), got)
