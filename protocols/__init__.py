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


def named_subclasses(package: str, modules: tuple[str, ...], base: type) -> dict[str, type]:
    """The subclasses of `base` with a `name`, defined in `package`'s `modules`, by name: the registry
    of a folder where each kind (a codec, a collective algorithm) is one file."""
    found: dict[str, type] = {}
    for mod in modules:
        for obj in vars(importlib.import_module(f"{package}.{mod}")).values():
            # (type(obj), not isinstance: a lazily imported module must not be loaded by looking at it)
            if issubclass(type(obj), type) and issubclass(obj, base) and obj is not base and obj.name:
                found[obj.name] = obj
    return found


def lazy_import(name: str) -> ModuleType:
    """Module `name`, loaded on first use of one of its attributes (importlib.util.LazyLoader): a process
    that only checks a config (the launcher, the room) never pays torch's two seconds of import. Once
    here, `import name` anywhere gives the same module."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
