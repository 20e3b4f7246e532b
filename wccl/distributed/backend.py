"""The `wccl` process group: torch.distributed collectives over screens and cameras.

Consumes: the collectives a program (or DDP, or a comm hook) calls on the
group. Emits: `torch.distributed.Work` objects whose futures complete, on
the node's thread, with the output tensors once every part has arrived over
the light (or fail with a clear error: a timeout, a mismatched call).

Each call becomes one `CollectiveRequest` (numbered in call order: the
group's sequence number) for the rank's node (wccl.distributed.rank_node). The
tensors travel as their raw bytes (little endian, C order); an algorithm of
protocols.algorithms moves them (all_see_all: one transfer per rank, and
every rank reduces the same parts in rank order; ring and star reduce on the
way, with these same torch operations) so every rank's result is the same
bit for bit. Zero-element tensors complete at once (they still take their
sequence number). scatter is the root's broadcast of every rank's share,
and all_to_all (and all_to_all_single, even or uneven) an all_gather of
every rank's part sizes and then of its whole input: each rank keeps what
was meant for it. A broadcast of DIGEST_BROADCAST_BYTES or more first
all-gathers a digest of what every rank holds: when every rank holds the
root's bytes already (DDP's start, on a model every rank seeded alike),
nothing more crosses; otherwise the broadcast goes on as usual. These
calls wait for their first all_gather before they return.

Point to point: `send` is one transfer to its peer (protocols.transfer op
"p2p", numbered among this rank's messages to that peer with that tag),
complete once the peer acknowledged it; `recv` takes the next message from
its source with its tag in the order they were sent (from any source: the
first to arrive). Neither takes a number of the group's collectives. With the launcher's status channel (wccl.distributed.status),
each finished collective is counted there: its tensor bytes and the rank's
room time.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from actors.collectives import REDUCE_OPS
from protocols.messages import CollectiveDone
from wccl.distributed.rank_node import RankNode
from wccl.distributed.status import StatusChannel

DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}
R = dist.ReduceOp.RedOpType
# torch's reduce ops by the names the collectives give them (their arithmetic: actors.collectives.REDUCE_OPS)
_OP_NAMES = {R.SUM: "sum", R.PRODUCT: "product", R.MIN: "min", R.MAX: "max", R.BAND: "band", R.BOR: "bor",
             R.BXOR: "bxor", R.AVG: "avg"}


DIGEST_BROADCAST_BYTES = 64 * 1024  # a broadcast this big first compares digests: equal bytes do not cross
DIGEST_BYTES = 16
GROUP_TAGS = 0xF000  # point-to-point tags from here on carry subgroups' collectives (group_tag)


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
    if red not in _OP_NAMES:
        raise WcclError(f"wccl: reduce op {red} is not supported")
    fn = getattr(torch, REDUCE_OPS[_OP_NAMES[red]])
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


def _done(value) -> dist.Work:
    """A Work already complete with `value` (nothing had to cross)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return WcclWork(fut)


def _even(rows: int, world: int, which: str) -> list[int]:
    if rows % world:
        raise ValueError(f"wccl: all_to_all_single: the {which}'s {rows} rows do not split evenly among {world} ranks")
    return [rows // world] * world


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

    def __init__(self, fut: torch.futures.Future, source: list[int] | None = None,
                 rank_of: Callable[[int], int] | None = None) -> None:
        super().__init__()
        self._fut = fut
        self._source = source  # a recv's: [the rank its message came from], once it came
        self._rank_of = rank_of  # a subgroup's recv: the group rank of a world rank

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

    def _source_rank(self) -> int:
        """The rank a recv's message came from (torch asks this of a recv from any source)."""
        self.wait()
        if not self._source:
            raise RuntimeError("wccl: not a recv: no source rank")
        return self._source[0] if self._rank_of is None else self._rank_of(self._source[0])


class WcclProcessGroup(dist.ProcessGroup):
    """A process group whose collectives travel as frames between screens and cameras."""

    def __init__(self, rank: int, world: int, node: RankNode, status: StatusChannel | None = None) -> None:
        super().__init__(rank, world)
        self._rank, self._world = rank, world
        self._node = node
        self._status = status  # the launcher's status channel: every finished collective, send and recv counted
        self._seq = itertools.count()
        self._sent: dict[tuple[int, int], int] = {}  # (peer, tag) -> messages sent to it with that tag
        self._group_name = ""
        self._lock = threading.Lock()  # the program's thread and a hook on a completion thread may both call

    def getBackendName(self) -> str:
        return "wccl"

    @property
    def group_name(self) -> str:
        """The name torch gave the group (torch's own property needs a C++ backend, which this has not)."""
        return self._group_name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

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
        (called on a completion thread of the node: RankNode.submit) and returns the future's value; for a
        reducing op (`reduce_op`, a torch ReduceOp) an algorithm may instead hand back the reduced tensor:
        `finish_reduced(flat)`."""
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
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if nbytes >= DIGEST_BROADCAST_BYTES and self._world > 1:
            # Every rank shows a digest of what it holds first: when all hold the root's bytes already (a
            # model every rank seeded alike, as DDP broadcasts at its start), nothing more crosses.
            digests = self._gather_digests(tensors)
            if all(d == digests[root] for d in digests):
                return _done(tensors)

        def finish(parts):
            if self._rank != root:
                _write(tensors, parts[root])
            return tensors

        return self._issue("broadcast", tensors, finish, root=root)

    def _gather_digests(self, tensors: list[torch.Tensor]) -> list[bytes]:
        """Every rank's digest of its `tensors`' bytes (an all_gather of DIGEST_BYTES each, waited for)."""
        mine = torch.frombuffer(bytearray(hashlib.blake2b(_to_bytes(tensors), digest_size=DIGEST_BYTES).digest()),
                                dtype=torch.uint8)
        outs = [torch.empty(DIGEST_BYTES, dtype=torch.uint8) for _ in range(self._world)]
        self.allgather([outs], [mine]).wait()
        return [bytes(o.numpy().tobytes()) for o in outs]

    def scatter(self, output_tensors, input_tensors, opts=None):
        """The root's list of `world` tensors, one to each rank: the root broadcasts them all, each rank
        keeps its own (every rank's share crosses to every rank)."""
        root = opts.rootRank if opts is not None else 0
        out = output_tensors[0]
        if self._rank == root:
            chunks = input_tensors[0]
            if len(chunks) != self._world:
                raise ValueError(f"wccl: scatter needs {self._world} input tensors on the root, got {len(chunks)}")
            if any(c.numel() != out.numel() for c in chunks):
                raise ValueError("wccl: scatter's input tensors must each have the output's size")
            if self._world == 1:
                _write([out], chunks[0].reshape(-1))
                return _done(output_tensors)
            inputs = [c.to(out.dtype) for c in chunks]
        else:
            inputs = [torch.empty(out.numel() * self._world, dtype=out.dtype)]
        n = out.numel()

        def finish(parts):
            _write([out], parts[root][self._rank * n:(self._rank + 1) * n])
            return output_tensors

        return self._issue("broadcast", inputs, finish, root=root)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """Tensor i of every rank's list goes to rank i: an all_gather of every rank's whole list, from
        which each rank keeps what is meant for it (every rank's list crosses to every rank)."""
        if len(input_tensors) != self._world or len(output_tensors) != self._world:
            raise ValueError(f"wccl: all_to_all needs {self._world} input and output tensors")
        sizes = [t.numel() for t in input_tensors]
        if self._world == 1:
            _write([output_tensors[0]], input_tensors[0].reshape(-1))
            return _done(output_tensors)
        return self._all_to_all(output_tensors, list(input_tensors), sizes, [t.numel() for t in output_tensors])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """all_to_all_single: `input` cut along its first dimension by `input_split_sizes` (equal parts
        when empty), part i to rank i; `output` filled in rank order by `output_split_sizes`."""
        rows_in = input.shape[0] if input.dim() else 1
        row = math.prod(input.shape[1:])  # elements a row (from the shape: a rank may send no rows at all)
        in_rows = list(input_split_sizes) or _even(rows_in, self._world, "input")
        out_rows = list(output_split_sizes) or _even(output.shape[0] if output.dim() else 1, self._world, "output")
        if len(in_rows) != self._world or len(out_rows) != self._world or sum(in_rows) != rows_in:
            raise ValueError(f"wccl: all_to_all_single: split sizes {in_rows} / {out_rows} do not cut the "
                             f"{rows_in} rows among {self._world} ranks")
        if self._world == 1:
            _write([output], input.reshape(-1))
            return _done([output])
        flat_in, flat_out = input.reshape(-1), output.reshape(-1)
        return self._all_to_all([flat_out], [flat_in], [r * row for r in in_rows], [r * row for r in out_rows],
                                whole=[output])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def _all_to_all(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], sizes: list[int],
                    out_sizes: list[int], whole: list[torch.Tensor] | None = None) -> dist.Work:
        """Send every rank's parts (`sizes` elements each, in rank order) to all; write into `outputs`
        (one tensor per rank, or one flat tensor cut by `out_sizes`) the part each rank meant for this one.
        Two all_gathers: every rank's part sizes first (waited for; no rank can know them otherwise, and
        every rank must issue the same collectives), then every rank's parts, padded to the longest, as
        one all_gather takes as much from every rank."""
        world, me = self._world, self._rank
        table = torch.tensor(sizes, dtype=torch.int64)
        gathered = [torch.empty(world, dtype=torch.int64) for _ in range(world)]
        self.allgather([gathered], [table]).wait()
        every = [g.tolist() for g in gathered]
        for r in range(world):
            if every[r][me] != out_sizes[r]:
                raise WcclError(f"wccl: all_to_all: rank {r} sends {every[r][me]} elements to this rank, which "
                                f"expects {out_sizes[r]}")
        longest = max(sum(row) for row in every)
        dtype = inputs[0].dtype
        pad = longest - sum(sizes)
        send = inputs + ([torch.zeros(pad, dtype=dtype)] if pad else [])

        def finish(parts):
            mine = [parts[r][sum(every[r][:me]):sum(every[r][:me]) + every[r][me]] for r in range(world)]
            if len(outputs) == world:
                for t, part in zip(outputs, mine):
                    _write([t], part)
            else:
                _write(outputs, torch.cat(mine))
            return whole if whole is not None else outputs

        return self._issue("allgather", send, finish)

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

    # ------------------------------------------------------------------ point to point
    def send(self, tensors, dstRank, tag=0):
        """`tensors[0]` to rank `dstRank`: one transfer its camera reads; complete once it acknowledged it."""
        tensor = tensors[0]
        self._p2p_checks(dstRank, tag, "send")
        _dtype_name(tensor)
        return WcclWork(self._counted(self._send_bytes(dstRank, tag, tensor, value=tensors), tensor))

    def recv(self, tensors, srcRank, tag=0):
        """Into `tensors[0]`: the next message rank `srcRank` sent this rank with `tag` (in its order)."""
        self._p2p_checks(srcRank, tag, "recv")
        return self._recv_into(tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag=0):
        """Into `tensors[0]`: the first message with `tag` to arrive from any rank (the Work's
        `_source_rank()` says which)."""
        self._p2p_checks(None, tag, "recv")
        return self._recv_into(tensors, -1, tag)

    def _recv_into(self, tensors, src: int, tag: int) -> dist.Work:
        tensor = tensors[0]
        _dtype_name(tensor)
        source: list[int] = []
        fut = self._counted(self._recv_bytes(src, tag, tensor, source), tensor)
        return WcclWork(fut.then(lambda f: (_write([tensor], f.value()), tensors)[1]), source)

    def _counted(self, fut: torch.futures.Future, tensor: torch.Tensor) -> torch.futures.Future:
        """`fut`, a send or receive of the program's: counted on the launcher's status line when it ends."""
        status = self._status
        if status is not None:
            nbytes = tensor.numel() * tensor.element_size()

            def count(f: torch.futures.Future) -> None:
                try:
                    f.value()
                    ok = True
                except Exception:  # noqa: BLE001 - the program gets the error from its Work; this only counts it
                    ok = False
                status.message_done(nbytes, ok, self._node.sim_seconds())

            fut.add_done_callback(count)
        return fut

    def _send_bytes(self, peer: int, tag: int, tensor: torch.Tensor, value=None) -> torch.futures.Future:
        """Send `tensor`'s bytes to global rank `peer` with `tag` (any tag: the group's own too); the
        future completes with `value` once the peer acknowledged them."""
        fut: torch.futures.Future = torch.futures.Future()
        if tensor.numel() == 0:  # nothing to carry (the matching recv of nothing completes at once too)
            fut.set_result(value)
            return fut
        payload = _to_bytes([tensor])

        def done(msg: CollectiveDone) -> None:
            if msg.error is not None:
                fut.set_exception(WcclError(f"wccl: {msg.error}"))
            else:
                fut.set_result(value)

        with self._lock:
            n = self._sent.get((peer, tag), 0)
            self._sent[(peer, tag)] = n + 1
            self._node.submit(seq=n, op="send", dtype=DTYPES[tensor.dtype], numel=tensor.numel(), inputs=(payload,),
                              root=peer, callback=done, tag=tag)
        return fut

    def _recv_bytes(self, src: int, tag: int, like: torch.Tensor, source: list[int] | None = None
                    ) -> torch.futures.Future:
        """The next message from global rank `src` (-1: any) with `tag`, of `like`'s dtype and size; the
        future's value is a flat tensor of it. `source` gets the rank it came from."""
        fut: torch.futures.Future = torch.futures.Future()
        if like.numel() == 0:
            if source is not None:
                source.append(src)
            fut.set_result(torch.empty(0, dtype=like.dtype))
            return fut

        def done(msg: CollectiveDone) -> None:
            if msg.error is not None:
                fut.set_exception(WcclError(f"wccl: {msg.error}"))
                return
            if source is not None:
                source.append(msg.source)
            fut.set_result(_from_bytes(msg.parts[0][0], like.dtype))

        with self._lock:
            self._node.submit(seq=0, op="recv", dtype=DTYPES[like.dtype], numel=like.numel(), inputs=(), root=src,
                              callback=done, tag=tag)
        return fut

    def _p2p_checks(self, peer: int | None, tag: int, what: str) -> None:
        if peer is not None and (not 0 <= peer < self._world or peer == self._rank):
            raise ValueError(f"wccl: {what}: rank {peer} is not another rank of the group (0..{self._world - 1})")
        if not 0 <= tag < GROUP_TAGS:
            raise ValueError(f"wccl: {what}: tag {tag}: tags are 0 to {GROUP_TAGS - 1} (the rest carry subgroups' "
                             "collectives)")


def group_tag(members: list[int], index: int) -> int:
    """The tag a subgroup's collectives travel under: one per set of members (a bit mask of the ranks) and
    per group made of that set before it (up to 16), the same on every member."""
    if index >= 16:
        raise NotImplementedError(f"wccl: subgroup of ranks {members}: at most 16 groups of one set of ranks")
    return GROUP_TAGS + sum(1 << r for r in members) * 16 + index


class WcclSubgroup(WcclProcessGroup):
    """Some of the world's ranks (`new_group`, `new_subgroups`): the same collectives, whose parts travel
    as point-to-point messages among the members only (each member's part to every other member; for a
    broadcast or scatter, the root's part), tagged with the group's own tag over the world group's node,
    and combined by the same code as the world group's (so in group rank order, the same bits on every
    member). Ranks outside the group see nothing of it: its transfers are addressed to members. Its
    collectives take no number of the world group's, and no agreement round: a member whose messages do
    not all arrive fails the collective (a WcclError, after `[collectives] timeout_s`) while the others
    may complete it."""

    def __init__(self, world_group: WcclProcessGroup, members: list[int], rank: int, index: int) -> None:
        super().__init__(rank, len(members), world_group._node, status=world_group._status)  # counted there too
        self._world_group = world_group
        self._members = list(members)  # global ranks, in group rank order
        self._tag = group_tag(self._members, index)

    def __repr__(self) -> str:
        return f"WcclSubgroup(rank={self._rank}, members={self._members}, node={self._node.node})"

    def shutdown(self) -> None:
        """Called by `destroy_process_group(group)`: nothing to stop (the world group's node goes on)."""

    def _issue(self, op: str, tensors: list[torch.Tensor], finish, root: int = 0, inputs=None, reduce_op=None,
               finish_reduced=None) -> dist.Work:
        inputs = tensors if inputs is None else inputs
        dtypes = {_dtype_name(t) for t in inputs} or {"uint8"}
        if len(dtypes) > 1:
            raise TypeError(f"wccl: one collective takes one dtype, got {', '.join(sorted(dtypes))}")
        name = dtypes.pop()
        torch_dtype = next(k for k, v in DTYPES.items() if v == name)
        if reduce_op is not None:
            _op_name(reduce_op, inputs)
        mine = torch.cat([t.detach().reshape(-1) for t in inputs]) if inputs else torch.empty(0, dtype=torch_dtype)
        senders = [root] if op == "broadcast" else list(range(self._world))
        world = self._world_group
        futures: list[torch.futures.Future] = []
        received: dict[int, torch.futures.Future] = {}
        if self._rank in senders:
            futures += [world._send_bytes(self._members[r], self._tag, mine) for r in range(self._world)
                        if r != self._rank]
        for r in senders:
            if r != self._rank:
                received[r] = world._recv_bytes(self._members[r], self._tag, mine)
                futures.append(received[r])
        out: torch.futures.Future = torch.futures.Future()

        def combine(_all) -> None:
            ok = False
            try:
                for f in futures:
                    f.value()  # raises the first error
                parts = [received[r].value() if r in received else mine for r in range(self._world)]
                out.set_result(finish(parts))
                ok = True
            except Exception as e:  # noqa: BLE001 - the future carries it to the program
                out.set_exception(e)
            if self._status is not None:
                self._status.collective_done(mine.numel() * mine.element_size(), ok, world._node.sim_seconds())

        torch.futures.collect_all(futures).add_done_callback(combine)
        return WcclWork(out)

    def send(self, tensors, dstRank, tag=0):
        self._p2p_checks(dstRank, tag, "send")
        return self._world_group.send(tensors, self._members[dstRank], tag)

    def recv(self, tensors, srcRank, tag=0):
        self._p2p_checks(srcRank, tag, "recv")
        return self._world_group.recv(tensors, self._members[srcRank], tag)

    def recv_anysource(self, tensors, tag=0):
        """Any member's next message with `tag` (a rank outside the group sending this rank that tag at
        the same time may be taken instead: keep the tags of groups apart)."""
        work = self._world_group.recv_anysource(tensors, tag)
        return WcclWork(work.get_future(), work._source, self._members.index)
