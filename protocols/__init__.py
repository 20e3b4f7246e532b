"""What crosses a boundary in WCCL, free of asyncio and I/O.

- `messages`: the typed, frozen messages actors exchange on in-process queues.
- `cells`: the cell colour codec (bytes <-> symbols <-> colours).
- `layout`: where cells sit on a screen image (data, pilots, parity marks,
  sender strips), how a frame and the idle pattern are drawn.
- `fec`: interleaved Reed-Solomon inside one frame.
- `frames`: the frame message (header, fountain packet, check) and the
  RaptorQ fountain code that cuts a tensor into packets and rebuilds it.
- `link`: the whole codec, tensor bytes <-> cell symbols.
- `tensors`: torch tensors <-> the bytes that travel.

Nothing here imports any other package of ours.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


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
