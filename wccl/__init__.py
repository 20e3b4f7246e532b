"""WCCL runtime and engines.

Runtime: `node` (CLI and composition root), `config`, `supervisor`, `actor`
(actor base and mailboxes), `timebase` (virtual and real time,
node clocks), `schedule`, `logs`.
Engines the actors drive: `room` (the simulated room medium), `media`
(the screen/camera interface and its implementations), `imaging` (finding
and reading codes in camera images), `training` (model, data, replicas), `compression` (the
gradient codecs: a tensor <-> the bytes that travel).
Tools: `lab` (link measurements).
"""

import os as _os

from protocols.registry import REGISTRY as _REGISTRY

# Every matrix here is small (colour fits of a few thousand cells by 19): BLAS threads only cost, and on
# a busy 2-core laptop OpenBLAS's spinning threads made one 6000x19 least-squares fit 300x slower
# (measured: 53 ms against 0.17 ms). Set before numpy loads; a user's own setting wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

# The modules that register the runtime's parts (protocols.registry: imported on first look at a kind).
_REGISTRY.sources("actor", "actors")
_REGISTRY.sources("codec", *(f"wccl.compression.{m}"
                              for m in ("fp32", "bf16", "int8", "sign", "topk", "sparseloco", "powersgd")))
for _kind in ("camera", "screen", "medium"):
    _REGISTRY.sources(_kind, "wccl.media.parts")
