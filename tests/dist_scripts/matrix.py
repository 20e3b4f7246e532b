"""Every collective, dtype, reduce op and async use the wccl backend supports: a part of parts.py, checked on
each rank. Each rank knows every rank's inputs (seeded generators), so it checks its results itself, bit
for bit against the same reduction in rank order. Its "digest" covers every result that must be the same
on every rank (a reduce-scatter's is each rank's own chunk: left out).
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
       "product": dist.ReduceOp.PRODUCT}


def data(rank: int, dtype: torch.dtype, n: int, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 3).to(dtype)
    hi = 4 if dtype == torch.uint8 else 50
    return torch.randint(0, hi, (n,), generator=g).to(dtype)


def expect(op: str, parts: list[torch.Tensor], world: int) -> torch.Tensor:
    fn = {"sum": torch.add, "avg": torch.add, "min": torch.minimum, "max": torch.maximum, "product": torch.mul}[op]
    out = parts[0].clone()
    for p in parts[1:]:
        out = fn(out, p)
    return out / world if op == "avg" else out


def run(rank: int, world: int, part_checks, wd) -> dict:
    cases = part_checks.cases
    results: list[torch.Tensor] = []
    checks = []  # (name, work or None, check())
    n = 37
    for di, dtype in enumerate(DTYPES):
        dn = str(dtype).removeprefix("torch.")
        for oi, (op, rop) in enumerate(OPS.items()):
            if op == "avg" and not dtype.is_floating_point:
                continue
            x = data(rank, dtype, n, 10 * di + oi)
            want = expect(op, [data(r, dtype, n, 10 * di + oi) for r in range(world)], world)
            asyn = (oi % 2 == 1)
            work = dist.all_reduce(x, op=rop, async_op=asyn)
            checks.append((f"all_reduce/{dn}/{op}/{'async' if asyn else 'sync'}", work,
                           lambda x=x, want=want: torch.equal(x, want), x))
        root = world - 1
        b = data(rank, dtype, n, 90 + di)
        checks.append((f"broadcast/{dn}/root{root}", dist.broadcast(b, src=root, async_op=True),
                       lambda b=b, dtype=dtype, di=di: torch.equal(b, data(root, dtype, n, 90 + di)), b))
        outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, data(rank, dtype, n, 50 + di))
        checks.append((f"all_gather/{dn}", None, lambda outs=outs, dtype=dtype, di=di: all(
            torch.equal(o, data(r, dtype, n, 50 + di)) for r, o in enumerate(outs)), torch.cat(outs)))
        flat = torch.zeros(n * world, dtype=dtype)
        dist.all_gather_into_tensor(flat, data(rank, dtype, n, 60 + di))
        checks.append((f"all_gather_into_tensor/{dn}", None, lambda flat=flat, dtype=dtype, di=di: torch.equal(
            flat, torch.cat([data(r, dtype, n, 60 + di) for r in range(world)])), flat))
        chunks = [data(rank, dtype, n, 70 + di + 100 * c) for c in range(world)]
        out = torch.zeros(n, dtype=dtype)
        dist.reduce_scatter(out, chunks)
        checks.append((f"reduce_scatter/{dn}", None, lambda out=out, dtype=dtype, di=di: torch.equal(
            out, expect("sum", [data(r, dtype, n, 70 + di + 100 * rank) for r in range(world)], world)), None))
        inp = torch.cat([data(rank, dtype, n, 80 + di + 100 * c) for c in range(world)])
        out2 = torch.zeros(n, dtype=dtype)
        dist.reduce_scatter_tensor(out2, inp, op=dist.ReduceOp.MAX)
        checks.append((f"reduce_scatter_tensor/{dn}/max", None, lambda out2=out2, dtype=dtype, di=di: torch.equal(
            out2, expect("max", [data(r, dtype, n, 80 + di + 100 * rank) for r in range(world)], world)), None))
    empty = torch.zeros(0)
    checks.append(("all_reduce/zero_elements", dist.all_reduce(empty, async_op=True),
                   lambda: empty.numel() == 0, empty))
    many = [torch.full((5,), float(rank + k)) for k in range(6)]  # several in flight at once
    works = [dist.all_reduce(t, async_op=True) for t in many]
    for k, (t, w) in enumerate(zip(many, works)):
        checks.append((f"all_reduce/in_flight_{k}", w, lambda t=t, k=k: torch.equal(
            t, torch.full((5,), float(sum(r + k for r in range(world))))), t))
    fut_val = []
    w = dist.all_reduce(torch.ones(3), async_op=True)
    w.get_future().then(lambda f: fut_val.append(f.value()[0].clone()))
    w.wait()
    dist.barrier()
    cases["barrier"] = True
    for name, work, check, tensor in checks:
        if work is not None:
            work.wait()
        cases[name] = bool(check())
        if tensor is not None:  # (a reduce-scatter's result is each rank's own chunk)
            results.append(tensor)
    cases["future_value"] = bool(fut_val and torch.equal(fut_val[0], torch.full((3,), float(world))))
    digest = hashlib.sha256(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in results)).hexdigest()
    return {"digest": digest}
