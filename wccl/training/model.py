"""The tiny CNN trained by WCCL and its deterministic initialisations.

Every initialisation draws from a private ``torch.Generator`` seeded by
``seed``: building a model never reads or advances torch's global RNG, so two
replicas built with the same ``(name, init, seed)`` are bit-identical whatever
else the process has done.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

__all__ = [
    "HackathonCNN",
    "MODELS",
    "INITS",
    "build_model",
    "flatten_params",
    "flatten_grads",
    "param_count",
]


class HackathonCNN(nn.Module):
    """conv(1->1, 3x3, pad 1) - ReLU - conv(1->1, 3x3, stride 2, pad 1) - ReLU
    - AdaptiveAvgPool2d(8) - flatten - Linear(64 -> 10).  670 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 1, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(1, 1, kernel_size=3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(8)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = self.pool(x)
        return self.fc(torch.flatten(x, 1))


# ---------------------------------------------------------------------------
# initialisations
# ---------------------------------------------------------------------------


def _torch_default_(module: nn.Module, gen: torch.Generator) -> None:
    """Exactly the distribution of torch's own ``reset_parameters`` for
    Conv2d/Linear (kaiming_uniform_(a=sqrt(5)) weights, U(+-1/sqrt(fan_in))
    biases), drawn from ``gen`` instead of the global RNG."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=gen)
            if m.bias is not None:
                fan_in = m.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                nn.init.uniform_(m.bias, -bound, bound, generator=gen)


def _dirac_convs_(model: nn.Module, gen: torch.Generator, noise: float) -> None:
    """Identity (centre tap = 1) kernels with small uniform noise, zero bias.

    With inputs >= 0 the first ReLU then starts fully alive (it passes the
    image), the second conv is a 2x down-sampler, and the head starts as a
    logistic regression on the 8x8 pooled image -- no dead single-channel
    ReLU whatever the seed."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            w = torch.empty_like(m.weight)
            nn.init.uniform_(w, -noise, noise, generator=gen)
            k = m.weight.shape[-1] // 2
            w[:, :, k, k] += 1.0
            m.weight.copy_(w)
            if m.bias is not None:
                m.bias.zero_()


def _init_default(model: nn.Module, gen: torch.Generator) -> None:
    _torch_default_(model, gen)


def _init_dirac(model: nn.Module, gen: torch.Generator) -> None:
    # Head keeps torch's default init (seed-dependent); the convs are Dirac.
    _torch_default_(model, gen)
    _dirac_convs_(model, gen, noise=0.05)


def _init_dirac_zero_head(model: nn.Module, gen: torch.Generator) -> None:
    # The recommended init (replica.DEFAULT_RECIPE): Dirac convs and an
    # all-zero classifier, so every seed starts from uniform softmax logits;
    # the conv noise (and the batch order) depend on the seed.  With Adam it
    # reached >= 0.80 after 30 steps for 20/20 seeds (see seeds.py).
    _torch_default_(model, gen)
    _dirac_convs_(model, gen, noise=0.05)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.weight.zero_()
            m.bias.zero_()


INITS: dict[str, Callable[[nn.Module, torch.Generator], None]] = {
    "default": _init_default,
    "dirac": _init_dirac,
    "dirac_zero_head": _init_dirac_zero_head,
}

class LeNet5(nn.Module):
    """LeCun's LeNet-5 for 28x28 inputs: conv(1->6, 5x5, pad 2) - ReLU - maxpool 2 - conv(6->16, 5x5) -
    ReLU - maxpool 2 - fc 400->120 - ReLU - fc 120->84 - ReLU - fc 84->10.  61,706 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc3(torch.relu(self.fc2(x)))


class FashionCNN(nn.Module):
    """conv(1->16, 3x3, pad 1) - ReLU - maxpool 2 - conv(16->32, 3x3, pad 1) - ReLU - maxpool 2 -
    fc 1568->64 - ReLU - fc 64->10.  105,866 parameters; >= 0.91 on Fashion-MNIST on one machine."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "hackathon_cnn": HackathonCNN,
    "lenet5": LeNet5,
    "fashion_cnn": FashionCNN,
}




def build_model(name: str, init: str, seed: int) -> nn.Module:
    """Build model ``name`` initialised by ``init`` from ``seed``.

    Deterministic and independent of torch's global RNG.  Raises ValueError
    for an unknown model or init name."""
    if name not in MODELS:
        raise ValueError(
            f"unknown model name {name!r}; known models: {', '.join(sorted(MODELS))}"
        )
    if init not in INITS:
        raise ValueError(
            f"unknown init {init!r} for model {name!r}; known inits: {', '.join(sorted(INITS))}"
        )
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    with torch.random.fork_rng(devices=[]):
        # fork_rng is belt and braces: construction's own default init would
        # consume the global RNG; we overwrite every parameter below anyway.
        model = MODELS[name]()
    with torch.no_grad():
        INITS[init](model, gen)
    return model


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flatten_params(model: nn.Module) -> torch.Tensor:
    """float32 1-D copy of all parameters, in ``model.parameters()`` order."""
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()]).clone()


def flatten_grads(model: nn.Module) -> torch.Tensor:
    """float32 1-D copy of all gradients (zeros where a grad is None)."""
    parts = []
    for p in model.parameters():
        if p.grad is None:
            parts.append(torch.zeros(p.numel(), dtype=torch.float32))
        else:
            parts.append(p.grad.detach().reshape(-1).to(torch.float32))
    return torch.cat(parts).clone()
