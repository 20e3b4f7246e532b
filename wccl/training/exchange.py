"""The built-in run's gradient exchange through a codec (protocols/codecs), and its state.

Per step of `python -m wccl.node` with `[training] codec = C`:
  1. each worker encodes its float32 gradient with C (`GradientEncoder`, which
     keeps its error-feedback residual: what C dropped is added to the next
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

import torch

from protocols.codecs import Codec, CodecError, ErrorFeedback, get_codec

__all__ = ["GradientEncoder", "Reduced", "reduce", "codec_from_config"]


def codec_from_config(training) -> Codec:
    """The codec a `[training]` section names, with its parameters."""
    return get_codec(training.codec, **training.codec_params())


class GradientEncoder:
    """One sender's side: gradient (float32) -> the bytes it shows, with error feedback."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.feedback = ErrorFeedback(codec)

    def encode(self, grad: torch.Tensor) -> bytes:
        return self.feedback.encode(grad)[0]

    def reset(self) -> None:
        """Forget the residual (the state it belonged to was replaced, e.g. by a snapshot)."""
        self.feedback.residual = None


class Reduced:
    """What the server's reduce made of one step's gradients."""

    def __init__(self, payload: bytes | None, average: torch.Tensor | None, used: list[str], nonfinite: list[str],
                 undecodable: list[str]) -> None:
        self.payload, self.average = payload, average  # the bytes to show, and what every reader decodes
        self.used, self.nonfinite, self.undecodable = used, nonfinite, undecodable


def reduce(codec: Codec, payloads: dict[str, bytes], numel: int, downlink: GradientEncoder | None,
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
    nonfinite = [n for n, g in decoded.items() if not bool(torch.isfinite(g).all())]
    used = [n for n in decoded if n not in nonfinite]
    if len(used) < max(1, quorum):
        return Reduced(None, None, [], nonfinite, undecodable)
    acc = torch.zeros(numel, dtype=torch.float32)
    for n in used:
        acc += decoded[n]
    acc /= float(len(used))
    data = downlink.encode(acc) if downlink is not None else codec.encode(acc)
    return Reduced(data, codec.decode(data, numel), used, nonfinite, undecodable)
