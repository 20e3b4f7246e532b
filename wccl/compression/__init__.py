"""Gradient and parameter-change codecs: pure encode/decode, one file per codec.

A codec turns a float32 1-D tensor into bytes and back. Codecs are pure: the
state some of them need (the error-feedback residual) lives beside the
training code, in `ErrorFeedback`, never here. `encoded_size(numel)` is exact
and the same on every rank, so encoded tensors can travel by all_gather.

Add a codec: write `wccl/compression/NAME.py` defining a `Codec` subclass with
`name = "NAME"`, registered with `@REGISTRY.part("codec")` (protocols.registry),
and list the module among the codec sources in wccl/__init__.py.

Every rank decodes the same bytes with the same code, so replicas that apply
the decoded values stay bit-identical; a rank must apply the *decoded* form of
its own contribution, not the tensor it encoded.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from abc import ABC, abstractmethod
from types import ModuleType
from typing import ClassVar

from protocols.registry import REGISTRY


class _Deferred(ModuleType):
    """A stand-in for a module not imported yet: the first attribute read imports the module (the usual
    way, into sys.modules) and takes over its namespace."""

    def __getattr__(self, attr: str):
        module = importlib.import_module(self.__name__)
        self.__dict__.update(vars(module))
        return getattr(module, attr)


def lazy_import(name: str) -> ModuleType:
    """Module `name`, imported on first use of one of its attributes: a process that only checks a config
    (the launcher, the room) never pays torch's two seconds of import. Until then it stays out of
    sys.modules, so `import name` or `import name.sub` elsewhere imports it the usual way, once."""
    if name in sys.modules:
        return sys.modules[name]
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return _Deferred(name)

# Loaded on first use: a config names and checks its codec without it (each codec module's `import torch`
# gets this same module).
torch = lazy_import("torch")

__all__ = ["Codec", "CodecError", "get_codec", "ErrorFeedback"]


class CodecError(ValueError):
    """A codec name or parameter is wrong, or encoded bytes do not fit the codec."""


class Codec(ABC):
    """Base class: float32 1-D tensor <-> bytes."""

    name: ClassVar[str] = ""
    error_feedback: ClassVar[bool] = False  # keep what encoding lost and add it to the next input
    params: ClassVar[tuple[str, ...]] = ()  # the keyword parameters the constructor accepts

    @abstractmethod
    def encoded_size(self, numel: int) -> int:
        """The exact length of `encode` of `numel` values (the same on every rank)."""

    @abstractmethod
    def encode(self, x: torch.Tensor) -> bytes:
        """The bytes that travel for `x` (float32, 1-D)."""

    @abstractmethod
    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        """`numel` float32 values from `data`; CodecError if `data` does not fit."""

    def bits_per_value(self, numel: int) -> float:
        return 8.0 * self.encoded_size(numel) / max(1, numel)

    def describe(self) -> str:
        ps = ", ".join(f"{p}={getattr(self, p)}" for p in self.params)
        return f"{self.name}({ps})" if ps else self.name

    # helpers for subclasses
    @staticmethod
    def _flat(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            x = x.to(torch.float32)
        return x.detach().reshape(-1).contiguous()

    def _check(self, data: bytes, numel: int) -> None:
        want = self.encoded_size(numel)
        if len(data) != want:
            raise CodecError(f"{self.name}: {len(data)} bytes cannot hold {numel} values (need {want})")


def get_codec(name: str, **params: object) -> Codec:
    """The codec `name` built with `params` (only those it accepts; None values are ignored)."""
    cls = REGISTRY.parts("codec").get(name)
    if cls is None:
        raise CodecError(f"unknown codec {name!r}; codecs are {', '.join(REGISTRY.names('codec'))}")
    kwargs = {k: v for k, v in params.items() if v is not None and k in cls.params}
    return cls(**kwargs)


class ErrorFeedback:
    """The state of one tensor's encoder: the residual of codecs with error feedback.

    encode(x) encodes x + residual and keeps residual = (x + residual) - decode(bytes):
    nothing the codec drops is lost, only delayed. For codecs without error
    feedback it is the plain encode. A tensor that is not finite is sent as
    all-NaN (readers leave it out) and never enters the residual."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.residual: torch.Tensor | None = None

    def reset(self) -> None:
        """Forget the residual (the state it belonged to was replaced, e.g. by a snapshot)."""
        self.residual = None

    def encode(self, x: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        """(bytes, decoded): what travels, and what every reader will decode from it."""
        x = Codec._flat(x)
        if not bool(torch.isfinite(x).all()):
            # A NaN or an Inf (a bad batch): sent as all-NaN, which every reader leaves out of its average,
            # and kept out of the residual, which would carry it into every later step.
            data = self.codec.encode(torch.full_like(x, float("nan")))
            return data, self.codec.decode(data, x.numel())
        if not self.codec.error_feedback:
            data = self.codec.encode(x)
            return data, self.codec.decode(data, x.numel())
        if self.residual is None or self.residual.numel() != x.numel():
            self.residual = torch.zeros_like(x)
        y = x + self.residual
        data = self.codec.encode(y)
        decoded = self.codec.decode(data, y.numel())
        self.residual = y - decoded
        return data, decoded
