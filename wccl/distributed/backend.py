"""The `wccl` process group: torch.distributed collectives over screens and cameras.

Consumes: the collectives a program (or DDP, or a comm hook) calls on the
group. Emits: `torch.distributed.Work` objects whose futures complete, on
the node's thread, with the output tensors once every part has arrived over
the light (or fail with a clear error: a timeout, a mismatched call).

Each call becomes one `CollectiveRequest` (numbered in call order: the
group's sequence number) for the rank's node (wccl.distributed.runtime). The
tensors travel as their raw bytes (little endian, C order); an algorithm of
protocols.algorithms moves them (all_see_all: one transfer per rank, and
every rank reduces the same parts in rank order; ring and star reduce on the
way, with these same torch operations) so every rank's result is the same
bit for bit. Zero-element tensors complete at once (they still take their
sequence number). With the launcher's status channel (wccl.distributed.status),
each finished collective is counted there: its tensor bytes and the rank's
room time.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from protocols.messages import CollectiveDone
from wccl.distributed.runtime import RankNode
from wccl.distributed.status import StatusChannel

DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}
R = dist.ReduceOp.RedOpType
_OPS: dict = {R.SUM: torch.add, R.PRODUCT: torch.mul, R.MIN: torch.minimum, R.MAX: torch.maximum,
              R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}
_OP_NAMES = {R.SUM: "sum", R.PRODUCT: "product", R.MIN: "min", R.MAX: "max", R.BAND: "band", R.BOR: "bor",
             R.BXOR: "bxor", R.AVG: "avg"}  # as protocols.algorithms.fold names them


class WcclError(RuntimeError):
    """A collective that could not be done (its message says why); no output was written."""


def _dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in DTYPES:
        raise TypeError(f"wccl: dtype {t.dtype} is not supported (supported: {', '.join(DTYPES.values())})")
    if t.device.type != "cpu":
        raise TypeError(f"wccl: tensors must be on the CPU, got {t.device}")
    return DTYPES[t.dtype]


def _to_bytes(tensors: list[torch.Tensor]) -> bytes:
    return b"".join(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors)


def _from_bytes(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)


def _reduce(parts: list[torch.Tensor], op, world: int) -> torch.Tensor:
    """Reduce in rank order (the same order, so the same bits, on every rank)."""
    red = getattr(op, "op", op)
    avg = red == R.AVG
    if avg:
        if not parts[0].is_floating_point():
            raise WcclError("wccl: ReduceOp.AVG needs a floating-point tensor")
        red = R.SUM
    if red not in _OPS:
        raise WcclError(f"wccl: reduce op {red} is not supported")
    fn = _OPS[red]
    out = parts[0].clone()
    for p in parts[1:]:
        out = fn(out, p)
    if avg:
        out = out / world
    return out


def _op_name(op, tensors: list[torch.Tensor]) -> str:
    """The reduce op's name for the algorithms; a WcclError now (before anything is sent) if unsupported."""
    red = getattr(op, "op", op)
    if red not in _OP_NAMES:
        raise WcclError(f"wccl: reduce op {red} is not supported")
    if red == R.AVG and tensors and not tensors[0].is_floating_point():
        raise WcclError("wccl: ReduceOp.AVG needs a floating-point tensor")
    return _OP_NAMES[red]


def _finish_reduce(flat: torch.Tensor, op, world: int) -> torch.Tensor:
    """An algorithm's reduced bytes (protocols.algorithms) as the result `_reduce` would give: AVG divides."""
    return flat / world if getattr(op, "op", op) == R.AVG else flat


def _write(outputs: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy `flat` into the output tensors, in order."""
    offset = 0
    with torch.no_grad():
        for t in outputs:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view(t.shape))
            offset += n


class WcclWork(dist.Work):
    """A collective under way: `wait()` returns once its result is written, and raises its error
    (torch's own future-wrapping Work would return normally from a failed future: a tensor left
    unreduced, silently)."""

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None) -> bool:
        self._fut.wait()  # raises the collective's error
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def result(self):
        return self._fut.value()


class WcclProcessGroup(dist.ProcessGroup):
    """A process group whose collectives travel as frames between screens and cameras."""

    def __init__(self, rank: int, world: int, node: RankNode, status: StatusChannel | None = None) -> None:
        super().__init__(rank, world)
        self._rank, self._world = rank, world
        self._node = node
        self._status = status  # the launcher's status channel: every finished collective is counted there
        self._seq = itertools.count()
        self._lock = threading.Lock()  # the program's thread and a hook on the node's thread may both call

    def getBackendName(self) -> str:
        return "wccl"

    def size(self) -> int:
        return self._world

    def shutdown(self) -> None:
        """Called by `destroy_process_group`: drain the node (peers read what they still need), stop it."""
        t = self._node.sim_seconds()
        self._node.close()
        if self._status is not None:
            self._status.flush(t)

    def __repr__(self) -> str:
        return f"WcclProcessGroup(rank={self._rank}, world={self._world}, node={self._node.node})"

    # ------------------------------------------------------------------ plumbing
    def _issue(self, op: str, tensors: list[torch.Tensor], finish: Callable[[list[torch.Tensor]], list[torch.Tensor]],
               root: int = 0, inputs: list[torch.Tensor] | None = None, reduce_op=None,
               finish_reduced: Callable[[torch.Tensor], list[torch.Tensor]] | None = None) -> dist.Work:
        """Send `inputs` (default `tensors`) as this rank's part; `finish(parts per rank)` writes the outputs
        (called on the node's thread) and returns the future's value; for a reducing op (`reduce_op`, a
        torch ReduceOp) an algorithm may instead hand back the reduced tensor: `finish_reduced(flat)`."""
        inputs = tensors if inputs is None else inputs
        dtypes = {_dtype_name(t) for t in inputs} or {"uint8"}
        if len(dtypes) > 1:
            raise TypeError(f"wccl: one collective takes one dtype, got {', '.join(sorted(dtypes))}")
        dtype = dtypes.pop()
        torch_dtype = next(k for k, v in DTYPES.items() if v == dtype)
        numel = sum(t.numel() for t in inputs)
        op_name = _op_name(reduce_op, inputs) if reduce_op is not None else "sum"
        payload = _to_bytes(inputs) if numel else b""
        fut: torch.futures.Future = torch.futures.Future()

        def done(msg: CollectiveDone) -> None:
            if self._status is not None:
                self._status.collective_done(len(payload), msg.error is None, self._node.sim_seconds())
            if msg.error is not None:
                fut.set_exception(WcclError(f"wccl: {msg.error}"))
                return
            try:
                if msg.reduced is not None:
                    if finish_reduced is None:
                        raise WcclError(f"wccl: {op} came back reduced by {msg.algorithm}, which it cannot use")
                    value = finish_reduced(_finish_reduce(_from_bytes(msg.reduced, torch_dtype), reduce_op,
                                                          self._world))
                else:
                    value = finish([_from_bytes(p[0], torch_dtype) for p in msg.parts])
            except Exception as e:  # noqa: BLE001 - the future carries it to the program
                fut.set_exception(e)
                return
            fut.set_result(value)

        with self._lock:
            seq = next(self._seq)
            self._node.submit(seq=seq, op=op, dtype=dtype, numel=numel, inputs=(payload,), root=root, callback=done,
                              reduce_op=op_name)
        return WcclWork(fut)

    # ------------------------------------------------------------------ collectives
    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def finish(parts):
            _write(tensors, _reduce(parts, op, self._world))
            return tensors

        def finish_reduced(flat):
            _write(tensors, flat)
            return tensors

        return self._issue("allreduce", tensors, finish, reduce_op=op, finish_reduced=finish_reduced)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0

        def finish(parts):
            if self._rank != root:
                _write(tensors, parts[root])
            return tensors

        return self._issue("broadcast", tensors, finish, root=root)

    def allgather(self, output_tensors, input_tensors, opts=None):
        outs = output_tensors[0]

        def finish(parts):
            for r, t in enumerate(outs):
                _write([t], parts[r])
            return output_tensors

        return self._issue("allgather", input_tensors, finish)

    def _allgather_base(self, output, input, opts=None):
        def finish(parts):
            _write([output], torch.cat(parts))
            return [output]

        return self._issue("allgather", [input], finish)

    def all_gather_single(self, output, input, opts=None):  # torch >= 2.13's name for _allgather_base
        return self._allgather_base(output, input, opts)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        def finish(parts):
            for r, outs in enumerate(output_lists):
                off = 0
                for t in outs:
                    _write([t], parts[r][off:off + t.numel()])
                    off += t.numel()
            return output_lists

        return self._issue("allgather", list(inputs), finish)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        def finish(parts):
            for i, out in enumerate(outputs):
                n = inputs[i].numel()
                off = sum(t.numel() for t in inputs[:i])
                _write([out], torch.cat([p[off:off + n] for p in parts]))
            return outputs

        return self._issue("allgather", list(inputs), finish)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        out, chunks = output_tensors[0], input_tensors[0]
        if len(chunks) != self._world:
            raise ValueError(f"wccl: reduce_scatter needs {self._world} input tensors, got {len(chunks)}")

        off = sum(c.numel() for c in chunks[:self._rank])
        n = chunks[self._rank].numel()

        def finish(parts):
            _write([out], _reduce([p[off:off + n] for p in parts], op, self._world))
            return output_tensors

        def finish_reduced(flat):
            _write([out], flat[off:off + n])
            return output_tensors

        return self._issue("reduce_scatter", list(chunks), finish, reduce_op=op, finish_reduced=finish_reduced)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if input.numel() != output.numel() * self._world:
            raise ValueError(f"wccl: reduce_scatter_tensor: input has {input.numel()} elements, "
                             f"expected {self._world} x {output.numel()}")
        n = output.numel()

        def finish(parts):
            _write([output], _reduce([p[self._rank * n:(self._rank + 1) * n] for p in parts], op, self._world))
            return [output]

        def finish_reduced(flat):
            _write([output], flat[self._rank * n:(self._rank + 1) * n])
            return [output]

        return self._issue("reduce_scatter", [input], finish, reduce_op=op, finish_reduced=finish_reduced)

    def reduce_scatter_single(self, output, input, opts=None):  # torch >= 2.13's name for _reduce_scatter_base
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def finish(parts):
            off = 0
            for out, inp in zip(outputs, inputs):
                n = out.numel()
                mine = [p[off + self._rank * n: off + (self._rank + 1) * n] for p in parts]
                _write([out], _reduce(mine, op, self._world))
                off += inp.numel()
            return outputs

        def finish_reduced(flat):
            off = 0
            for out, inp in zip(outputs, inputs):
                n = out.numel()
                _write([out], flat[off + self._rank * n: off + (self._rank + 1) * n])
                off += inp.numel()
            return outputs

        return self._issue("reduce_scatter", list(inputs), finish, reduce_op=op, finish_reduced=finish_reduced)

    def reduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        root = opts.rootRank if opts is not None else 0

        def finish(parts):
            if self._rank == root:
                _write(tensors, _reduce(parts, op, self._world))
            return tensors

        def finish_reduced(flat):
            if self._rank == root:
                _write(tensors, flat)
            return tensors

        return self._issue("allreduce", tensors, finish, reduce_op=op, finish_reduced=finish_reduced)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0

        def finish(parts):
            if self._rank == root:
                for r, t in enumerate(output_tensors[0]):
                    _write([t], parts[r])
            return output_tensors

        return self._issue("allgather", input_tensors, finish)

    def barrier(self, opts=None):
        token = torch.ones(1, dtype=torch.uint8)
        return self._issue("barrier", [token], lambda parts: [token])

    # Not carried over the light yet: say so instead of hanging.
    def _unsupported(self, name: str):
        raise NotImplementedError(f"wccl: {name} is not supported (supported: all_reduce, broadcast, all_gather, "
                                  "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, reduce, gather, "
                                  "barrier)")

    def alltoall(self, *a, **k):
        self._unsupported("all_to_all")

    def all_to_all_single(self, *a, **k):
        self._unsupported("all_to_all_single")

    def recv_anysource(self, *a, **k):
        self._unsupported("recv_anysource")

    def scatter(self, *a, **k):
        self._unsupported("scatter")

    def send(self, *a, **k):
        self._unsupported("send")

    def recv(self, *a, **k):
        self._unsupported("recv")
