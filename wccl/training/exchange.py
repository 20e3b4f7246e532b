"""The built-in run's gradient exchange through a codec (wccl/compression), and its state.

Per step of `python -m wccl.node` with `[training] codec = C`:
  1. each worker encodes its float32 gradient with C through its own
     `ErrorFeedback` (wccl.compression: what C dropped is added to the next
     step's gradient) and shows the bytes;
  2. the server decodes every worker's bytes, leaves out those that are not
     finite, averages the rest in float32 in sorted-name order (`reduce`) and
     encodes the average with C again, with its own error feedback (a second
     residual: the downlink is compressed too);
  3. every replica, the server's included, applies the *decoded* average, so
     all of them apply the same bits and stay identical; the encoders'
     residuals are local and never need to agree.

With `bf16` (the default, no error feedback) this is exactly the run before
codecs: each gradient rounded to bfloat16, summed in float32, divided, rounded
to bfloat16 again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wccl.compression import Codec, CodecError, ErrorFeedback, get_codec

__all__ = ["Reduced", "reduce", "mean_of", "codec_from_config"]


def mean_of(tensors: dict) -> tuple[torch.Tensor | None, list, list]:
    """The one average of WCCL's exchanges: (the float32 mean of the tensors without a NaN or an Inf,
    summed in sorted-key order so that every node that computes it gets the same bits, or None when
    none is finite; the keys used; the keys left out, sorted). What to do when nothing is usable is the
    caller's: the parameter server skips the step, a DDP hook leaves the gradient at zero."""
    keys = sorted(tensors)
    bad = [k for k in keys if not bool(torch.isfinite(tensors[k]).all())]
    used = [k for k in keys if k not in bad]
    if not used:
        return None, [], bad
    acc = torch.zeros(tensors[used[0]].reshape(-1).shape, dtype=torch.float32)
    for k in used:
        acc += tensors[k].detach().reshape(-1).to(torch.float32)
    acc /= float(len(used))
    return acc, used, bad


def codec_from_config(training) -> Codec:
    """The codec a `[training]` section names, with its parameters."""
    return get_codec(training.codec, **training.codec_params())


@dataclass(frozen=True)
class Reduced:
    """What the server's reduce made of one step's gradients: the bytes to show and what every reader
    decodes from them (None: nothing averaged), and which workers' gradients were used or left out."""

    payload: bytes | None
    average: torch.Tensor | None
    used: list[str]
    nonfinite: list[str]
    undecodable: list[str]


def reduce(codec: Codec, payloads: dict[str, bytes], numel: int, downlink: ErrorFeedback | None,
           quorum: int = 1) -> Reduced:
    """Decode each worker's bytes, drop the undecodable and the non-finite, average the rest in float32 in
    sorted-name order, and encode the average (with `downlink`'s error feedback; None: plain encode).
    `Reduced.average` is the decoded form every replica applies; with fewer than `quorum` usable
    gradients nothing is averaged (payload and average None, `downlink` untouched)."""
    decoded: dict[str, torch.Tensor] = {}
    undecodable: list[str] = []
    for name in sorted(payloads):
        try:
            decoded[name] = codec.decode(payloads[name], numel)
        except CodecError:
            undecodable.append(name)
    acc, used, nonfinite = mean_of(decoded)
    if acc is None or len(used) < max(1, quorum):
        return Reduced(None, None, [], nonfinite, undecodable)
    data = downlink.encode(acc)[0] if downlink is not None else codec.encode(acc)
    return Reduced(data, codec.decode(data, numel), used, nonfinite, undecodable)
