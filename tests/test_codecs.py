"""Codecs (wccl/compression): round trips, exact sizes, error feedback, config errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wccl.compression import CodecError, ErrorFeedback, get_codec
from protocols.registry import REGISTRY
from wccl.config import ConfigError, load_config

ROOM = ('[[room.nodes]]\nname = "a"\nroles = ["server", "worker"]\n'
        '[[room.nodes]]\nname = "b"\nroles = ["worker"]\n')
finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, width=32)
vectors = st.lists(finite, min_size=0, max_size=700).map(lambda v: torch.tensor(v, dtype=torch.float32))
ALL = REGISTRY.names("codec")


def test_the_issue_codecs_are_registered():
    assert set(ALL) == {"fp32", "bf16", "int8", "sign_ef", "topk_ef", "sparseloco", "powersgd"}


@settings(max_examples=60, deadline=None)
@given(x=vectors, name=st.sampled_from(ALL))
def test_size_is_exact_and_decode_is_deterministic(x, name):
    c = get_codec(name)
    data = c.encode(x)
    assert len(data) == c.encoded_size(x.numel())
    a, b = c.decode(data, x.numel()), c.decode(bytes(data), x.numel())
    assert a.dtype == torch.float32 and a.shape == x.shape
    assert torch.equal(a, b)
    with pytest.raises(CodecError):
        c.decode(data + b"\0", x.numel())


@settings(max_examples=60, deadline=None)
@given(x=vectors)
def test_fp32_is_exact_and_bf16_rounds_like_torch(x):
    assert torch.equal(get_codec("fp32").decode(get_codec("fp32").encode(x), x.numel()), x)
    assert torch.equal(get_codec("bf16").decode(get_codec("bf16").encode(x), x.numel()),
                       x.to(torch.bfloat16).to(torch.float32))


@settings(max_examples=60, deadline=None)
@given(x=vectors, block=st.sampled_from([8, 64, 256]))
def test_int8_error_is_at_most_half_a_step_per_block(x, block):
    c = get_codec("int8", block=block)
    y = c.decode(c.encode(x), x.numel())
    for i in range(0, x.numel(), block):
        xs, ys = x[i:i + block], y[i:i + block]
        step = float(xs.abs().max()) / 127
        assert float((xs - ys).abs().max()) <= step / 2 + 1e-6 * (1 + step)


@settings(max_examples=60, deadline=None)
@given(x=vectors)
def test_sign_keeps_signs_and_block_mean_magnitude(x):
    c = get_codec("sign_ef", block=64)
    y = c.decode(c.encode(x), x.numel())
    for i in range(0, x.numel(), 64):
        xs, ys = x[i:i + 64], y[i:i + 64]
        mean = float(xs.abs().mean())
        assert torch.allclose(ys.abs(), torch.full_like(ys, mean), rtol=1e-6, atol=1e-6)
        # (a block whose mean magnitude underflows float32, of subnormals, decodes to zeros: no sign left)
        assert bool((((ys >= 0) == (xs >= 0)) | (ys == 0)).all())


@settings(max_examples=60, deadline=None)
@given(x=vectors, ratio=st.sampled_from([0.01, 0.1, 0.5, 1.0]))
def test_topk_sends_the_largest_magnitudes(x, ratio):
    c = get_codec("topk_ef", ratio=ratio)
    y = c.decode(c.encode(x), x.numel())
    n = x.numel()
    if n == 0:
        return
    k = c.k(n)
    assert int((y != 0).sum()) <= k
    kept = x.abs().sort(descending=True, stable=True).indices[:k]
    scale = float(x[kept].abs().max()) / 127
    assert float((y[kept] - x[kept]).abs().max()) <= scale / 2 + 1e-6 * (1 + scale)
    others = torch.ones(n, dtype=torch.bool)
    others[kept] = False
    assert bool((y[others] == 0).all())


@settings(max_examples=60, deadline=None)
@given(x=vectors, ratio=st.sampled_from([0.01, 0.1, 0.5, 1.0]), chunk=st.sampled_from([2, 7, 64, 4096]))
def test_sparseloco_sends_each_chunks_largest_with_their_sign_and_one_of_two_levels(x, ratio, chunk):
    c = get_codec("sparseloco", ratio=ratio, chunk=chunk)
    y = c.decode(c.encode(x), x.numel())
    for i in range(0, x.numel(), chunk):
        xs, ys = x[i:i + chunk], y[i:i + chunk]
        k = min(len(xs), max(1, math.ceil(ratio * len(xs))))
        kept = xs.abs().sort(descending=True, stable=True).indices[:k]
        others = torch.ones(len(xs), dtype=torch.bool)
        others[kept] = False
        assert bool((ys[others] == 0).all())
        top = (k + 1) // 2
        hi, lo = xs[kept[:top]].abs().mean(), xs[kept[top:]].abs().mean() if k > top else None
        want = torch.tensor([float(hi)] * top + ([float(lo)] * (k - top) if lo is not None else []))
        want16 = want.to(torch.float16).to(torch.float32)
        assert torch.equal(ys[kept].abs(), want16)  # each kept value: its half's mean magnitude (float16)
        assert bool((((ys[kept] >= 0) == (xs[kept] >= 0)) | (ys[kept] == 0)).all())


def test_sparseloco_refuses_offsets_out_of_order():
    c = get_codec("sparseloco", ratio=0.5, chunk=8)
    data = bytearray(c.encode(torch.arange(8, dtype=torch.float32)))  # keeps offsets 4..7: 3 bits + 2 each
    bits = np.unpackbits(np.frombuffer(bytes(data[4:]), dtype=np.uint8))
    bits[0:3] = [1, 1, 1]  # the first offset now 7: not below the next one
    data[4:] = np.packbits(bits).tobytes()
    with pytest.raises(CodecError, match="out of order"):
        c.decode(bytes(data), 8)


def test_powersgd_is_near_exact_on_low_rank_input():
    m, c = 40, 40
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(m, 2, generator=g) @ torch.randn(2, c, generator=g)).reshape(-1)[:1600]
    codec = get_codec("powersgd", rank=2)
    y = codec.decode(codec.encode(x), x.numel())
    assert float((y - x).norm() / x.norm()) < 0.02  # bf16 factors: about 3 significant digits
    assert codec.encoded_size(1600) == 2 * 2 * (40 + 40)


@settings(max_examples=40, deadline=None)
@given(xs=st.lists(st.lists(finite, min_size=50, max_size=50), min_size=1, max_size=6),
       name=st.sampled_from(["sign_ef", "topk_ef", "sparseloco", "powersgd"]))
def test_error_feedback_loses_nothing_only_delays_it(xs, name):
    """After any sequence of inputs: sum of what was decoded + the residual == sum of the inputs."""
    ef = ErrorFeedback(get_codec(name))
    sent = torch.zeros(50, dtype=torch.float64)
    total = torch.zeros(50, dtype=torch.float64)
    for v in xs:
        x = torch.tensor(v, dtype=torch.float32)
        data, decoded = ef.encode(x)
        assert torch.equal(decoded, ef.codec.decode(data, 50))  # what readers get is what the writer applies
        sent += decoded.double()
        total += x.double()
    scale = 1 + float(total.abs().max())
    assert torch.allclose(sent + ef.residual.double(), total, rtol=0, atol=1e-4 * scale * len(xs))


def test_error_feedback_residual_shrinks_the_error_over_time():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5000, generator=g)
    ef, plain = ErrorFeedback(get_codec("topk_ef", ratio=0.05)), get_codec("topk_ef", ratio=0.05)
    sent = torch.zeros(5000)
    for _ in range(100):  # the same gradient 100 times: EF delivers ~all of it, plain top-k 5 % of it
        sent += ef.encode(x)[1]
    one = plain.decode(plain.encode(x), 5000)
    assert float((sent / 100 - x).norm() / x.norm()) < 0.1 < float((one - x).norm() / x.norm())


def test_bits_per_value_of_the_compressing_codecs():
    n = 105_866  # fashion_cnn
    bits = {name: get_codec(name).bits_per_value(n) for name in ALL}
    assert bits["fp32"] == 32 and bits["bf16"] == 16
    assert 8 < bits["int8"] < 8.2 and 1 < bits["sign_ef"] < 1.2
    assert bits["topk_ef"] <= 16 / 32 and bits["powersgd"] <= 16 / 32  # >= 32x fewer bytes than bf16
    assert bits["sparseloco"] < 0.31 < bits["sign_ef"] / 3.5  # 2 % of the values at 14 bits each


@pytest.mark.parametrize("name,params,match", [
    ("nope", {}, "unknown codec 'nope'"),
    ("topk_ef", {"ratio": 0}, "ratio"),
    ("topk_ef", {"ratio": 1.5}, "ratio"),
    ("int8", {"block": 0}, "block"),
    ("sign_ef", {"block": 12}, "multiple of 8"),
    ("powersgd", {"rank": 0}, "rank"),
    ("sparseloco", {"ratio": 0}, "ratio"),
    ("sparseloco", {"chunk": 1}, "chunk"),
])
def test_bad_codec_or_parameter_is_a_clear_error(name, params, match):
    with pytest.raises(CodecError, match=match):
        get_codec(name, **params)


@pytest.mark.parametrize("training,key", [
    ({"codec": "zstd"}, "training.codec: 'zstd' is not a codec"),
    ({"topk_ratio": 2}, "training.topk_ratio"),
    ({"sync_every": 0}, "training.sync_every"),
    ({"codec": "sign_ef", "codec_block": 12}, "codec_block"),
    ({"split": "by_colour"}, "training.split"),
    ({"model": "resnet"}, "training.model"),
    ({"overlap": True, "drift_correction": True}, "training.overlap: drift_correction needs each round's average"),
])
def test_bad_training_codec_keys_name_the_key(tmp_path, training, key):
    lines = [ROOM + "[training]"]
    for k, v in training.items():
        lines.append(f"{k} = {json.dumps(v)}")
    f = tmp_path / "room.toml"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert key in str(e.value)


def test_model_defaults_fill_what_the_file_leaves_out(tmp_path):
    f = tmp_path / "room.toml"
    f.write_text(ROOM + '[training]\nmodel = "fashion_cnn"\n')
    tr = load_config(f).training
    assert (tr.init, tr.lr, tr.batch_size) == ("default", 0.002, 64)
    f.write_text(ROOM + '[training]\nlr = 0.01\n')
    tr = load_config(f).training
    assert (tr.model, tr.init, tr.lr, tr.batch_size) == ("hackathon_cnn", "dirac_zero_head", 0.01, 512)


def test_builtin_run_refuses_what_only_the_backend_does(tmp_path, capsys):
    from wccl.node import main

    f = tmp_path / "room.toml"
    f.write_text(ROOM + '[training]\ncodec = "topk_ef"\nsync_every = 4\n')
    assert main(["--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "sync_every = 4" in err and "local steps" in err and "codec" not in err.split("sync_every")[0]


def test_sizes_match_numpy_expectations():
    n = 1000
    assert get_codec("int8", block=256).encoded_size(n) == 4 * math.ceil(n / 256) + n
    assert get_codec("sign_ef", block=256).encoded_size(n) == 4 * 4 + 125
    assert get_codec("topk_ef", ratio=0.01).encoded_size(n) == 4 + 10 * 3
    assert get_codec("topk_ef", ratio=0.01).encoded_size(70_000) == 4 + 700 * 5
    assert np.dtype("<f4").itemsize == 4


@pytest.mark.parametrize("name", ALL)
def test_a_nonfinite_tensor_is_sent_as_nan_left_out_of_the_average_and_out_of_the_residual(name):
    from wccl.distributed.hooks import NONFINITE, average_decoded

    codec = get_codec(name)
    ef = ErrorFeedback(codec)
    good = torch.linspace(-1, 1, 600)
    ef.encode(good)
    residual = None if ef.residual is None else ef.residual.clone()
    bad = good.clone()
    bad[17] = float("nan") if name != "fp32" else float("inf")
    data, decoded = ef.encode(bad)
    assert not bool(torch.isfinite(decoded).all())
    assert (residual is None and ef.residual is None) or torch.equal(ef.residual, residual)
    other, _ = ErrorFeedback(codec).encode(good)
    before = NONFINITE[1]
    avg = average_decoded(codec, [other, data], 600)
    assert torch.equal(avg, codec.decode(other, 600)) and NONFINITE[1] == before + 1
    assert torch.equal(average_decoded(codec, [data, data], 600), torch.zeros(600))


@pytest.mark.parametrize("name", ALL)
def test_every_codec_can_be_named_in_a_room_file(tmp_path, name):
    from wccl.training.exchange import codec_from_config

    f = tmp_path / "room.toml"
    f.write_text(ROOM + f'[training]\ncodec = "{name}"\n')
    codec = codec_from_config(load_config(f).training)  # powersgd's iters has no key: the codec's default
    assert codec.name == name


def test_divergence_is_told_from_noise():
    from wccl.training.divergence import DivergenceWatch

    # the built-in run's bob with sign_ef under Adam at lr 0.05 (it ended at chance), and with int8 (0.876)
    collapsed = [2.30, 2.26, 2.18, 1.96, 1.71, 1.27, 0.95, 1.24, 1.05, 1.05, 1.23, 2.08, 2.36, 2.05, 1.85, 1.18]
    healthy = [2.30, 2.19, 1.93, 1.48, 1.12, 0.75, 0.78, 0.70, 0.73, 0.66, 0.68, 0.62, 0.63, 0.55, 0.63, 0.43,
               0.56, 0.56, 0.52, 0.46, 0.46, 0.41, 0.45, 0.41, 0.44, 0.43, 0.41, 0.40, 0.37, 0.42]
    w = DivergenceWatch()
    said = [i for i, x in enumerate(collapsed) if w.observe(x)]
    assert said == [13] and "rose from 1.1" in w.reason
    w = DivergenceWatch()
    assert not any(w.observe(x) for x in healthy) and w.reason is None
    # a laptop's own five classes (by class, Fashion-MNIST): window means 0.0485 then 0.0732 is noise
    w = DivergenceWatch(window=2)
    assert not any(w.observe(x) for x in (2.3, 1.0, 0.05, 0.047, 0.07, 0.076)) and w.reason is None
    w = DivergenceWatch()
    assert [w.observe(x) is not None for x in (2.3, 1.0, float("nan"), float("nan"))] == [False, False, True, False]
    assert "nan at step 3" in w.reason
    w = DivergenceWatch(window=100)  # lenet5 under Adam at lr 0.5: 2.31, then 324,569 (it ended at chance)
    assert [w.observe(x) is not None for x in (2.31, 3.0, 324568.7)] == [False, False, True]
    assert "jumped from 2.31 at step 1 to 3.25e+05 at step 3" in w.reason


def test_a_config_check_imports_no_torch_and_torch_imports_normally_after_it():
    """The codecs load torch on first use, so checking a config (the launcher, the room) pays no torch
    import; a module that then imports torch's submodules (`import torch.distributed`, as the built-in run
    on collectives does) gets them imported once, as without the codecs (a deferred torch in sys.modules
    ran torch.distributed's initialisation twice: the process aborted)."""
    import subprocess
    import sys

    code = ("import sys; import wccl.config; assert 'torch' not in sys.modules; "
            "import torch.distributed, torch.nn; from wccl.compression import get_codec, torch as t; "
            "x = torch.arange(4, dtype=torch.float32); c = get_codec('bf16'); "
            "assert torch.equal(c.decode(c.encode(x), 4), x) and t.float32 is torch.float32; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]
