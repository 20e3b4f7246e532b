"""DDP communication hooks that compress gradients with WCCL's codecs (wccl/compression).

    from wccl.distributed import hooks
    model = DistributedDataParallel(net)
    model.register_comm_hook(*hooks.codec_hook("topk_ef", ratio=0.01))

Each bucket's gradient is encoded (with error feedback for `sign_ef`,
`topk_ef` and `powersgd`; the residual is this rank's state, kept per
bucket), the bytes of every rank are exchanged with one all_gather, and every
rank decodes all of them and averages them in rank order: one round, and the
same bits on every rank, so replicas never drift. Works over any backend
that has all_gather (wccl, gloo).

torch's own hooks (`powerSGD_hook`, `fp16_compress_hook`,
`bf16_compress_hook`) also run unchanged over the wccl backend; `powersgd`
here is the one-round variant (both factors in one exchange).
"""

from __future__ import annotations

from collections import Counter

from dataclasses import dataclass, field
from typing import Any, Callable

import structlog
import torch
import torch.distributed as dist

from wccl.compression import Codec, ErrorFeedback, get_codec
from wccl.training.exchange import mean_of

__all__ = ["CodecHookState", "codec_hook", "exchange"]


@dataclass
class CodecHookState:
    codec: Codec
    group: Any = None
    feedback: dict[int, ErrorFeedback] = field(default_factory=dict)  # bucket index -> its residual
    bytes_sent: int = 0  # encoded bytes this rank has sent (what crossed, before framing)
    values_sent: int = 0  # gradient values those bytes stood for

    def encoder(self, key: int) -> ErrorFeedback:
        if key not in self.feedback:
            self.feedback[key] = ErrorFeedback(self.codec)
        return self.feedback[key]


def exchange(data: bytes, group=None) -> torch.futures.Future:
    """all_gather one byte string of the same length from every rank; a future of the list, in rank order."""
    world = dist.get_world_size(group)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    out = [torch.empty_like(t) for _ in range(world)]
    fut = dist.all_gather(out, t, group=group, async_op=True).get_future()
    return fut.then(lambda f: [o.numpy().tobytes() for o in out])


NONFINITE = Counter()  # contributions left out of an average because they held a NaN or an Inf, by rank


def average_decoded(codec: Codec, parts: list[bytes], numel: int) -> torch.Tensor:
    """The mean of every rank's decoded tensor (wccl.training.exchange.mean_of: summed in rank order, the
    same bits on every rank).

    A contribution with a NaN or an Inf (a bad batch, a bad peer) never enters the mean: it is left out,
    counted in NONFINITE and logged (`gradient_nonfinite`); every rank sees the same parts, so every rank
    leaves out the same ones. With none left, this hook's gradient is zero: DDP's step goes on without one."""
    mean, used, bad = mean_of({rank: codec.decode(raw, numel) for rank, raw in enumerate(parts)})
    if bad:
        NONFINITE.update(bad)
        structlog.get_logger("wccl").warning("gradient_nonfinite", ranks=bad, used=len(used))
    return mean if mean is not None else torch.zeros(numel, dtype=torch.float32)


def _hook(state, bucket):  # no annotations: DDP checks them literally, and this module's are strings
    """(CodecHookState, dist.GradBucket) -> Future[Tensor]."""
    buf = bucket.buffer()
    numel = buf.numel()
    data, _ = state.encoder(bucket.index()).encode(buf)
    state.bytes_sent += len(data)
    state.values_sent += numel

    def finish(fut: torch.futures.Future) -> torch.Tensor:
        buf.copy_(average_decoded(state.codec, fut.value(), numel).to(buf.dtype))
        return buf

    return exchange(data, state.group).then(finish)


def codec_hook(name: str, group=None, **params: object) -> tuple[CodecHookState, Callable]:
    """(state, hook) for `DistributedDataParallel.register_comm_hook(state, hook)`."""
    return CodecHookState(get_codec(name, **params), group), _hook
