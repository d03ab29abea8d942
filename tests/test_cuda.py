"""Device-following: what the README's "On a GPU" paragraph promises.

Two kinds of tests:

* ``@needs_cuda``: run only where torch sees a CUDA device (skipped here, with the reason).
  They compare CUDA results with CPU references and ``nn.MultiheadAttention`` on CUDA,
  train a tiny model on CUDA from CPU data, and check the caller's CUDA RNG is untouched.
* the rest run everywhere: the same code paths, exercised on the CPU with the ``meta``
  device (tensors with a device but no data) or by replacing ``torch.cuda`` functions,
  so a CPU-only machine still checks which device every helper picks.
"""
from __future__ import annotations

import contextlib
import importlib
import os

import pytest
import torch
from torch import nn

import helpers
from helpers.attention import MultiHeadAttention, causal_mask
from helpers.heads import attention_at_offset, attention_maps, head_importance, induction_score
from helpers.model import TinyTransformer
from helpers.rope import RotaryEmbedding, _device_key, apply_rope, apply_rope_complex
from helpers.tasks import LookbackTask
from helpers.train import _rng_devices, evaluate, model_device, to_device, train

train_mod = importlib.import_module("helpers.train")  # the module (helpers.train is also the function's name)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False")
TASK = LookbackTask(num_symbols=6, seq_len=10, k=2)


@pytest.fixture
def deterministic():
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def _model(seed=0):
    return TinyTransformer(TASK.vocab_size, 32, 2, 1, TASK.seq_len, pos="rope", seed=seed)


# ---------------------------------------------------------------- CPU stand-ins
def test_model_device_is_the_first_parameters_device():
    assert model_device(nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(nn.Linear(2, 2, device="meta")) == torch.device("meta")
    assert model_device(nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU


def test_to_device_moves_every_tensor_of_the_batch():
    x, y = torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    xm, ym = to_device((x, y), torch.device("meta"))
    assert xm.device.type == ym.device.type == "meta" and xm.shape == x.shape and ym.dtype == y.dtype
    same = to_device((x,), torch.device("cpu"))[0]
    assert same is x  # already there: no copy


def test_rng_devices_fork_every_cuda_device_on_cuda(monkeypatch):
    assert _rng_devices(torch.device("cpu")) == ([], None)
    assert _rng_devices(torch.device("meta")) == ([], None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    # torch.manual_seed re-seeds every CUDA device, so every one is saved and restored
    assert _rng_devices(torch.device("cuda", 1)) == ([0, 1], "cuda")


def test_train_and_evaluate_send_batches_to_the_model_device_and_fork_its_rng(monkeypatch, deterministic):
    """Pretend the model lives on cuda:0: every batch must be sent there and the CUDA RNG forked."""
    sent, forks = [], []
    real_fork = torch.random.fork_rng

    @contextlib.contextmanager
    def recording_fork(devices=None, enabled=True, device_type=None, **kw):
        forks.append((list(devices), device_type))
        with real_fork(devices=[], enabled=enabled):  # no real CUDA here: fork the CPU only
            yield

    def recording_to_device(batch, device):
        sent.append(device)
        return batch  # stay on the CPU, where the model really is

    model, other = _model(), _model(1)
    monkeypatch.setattr(train_mod, "model_device", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(train_mod, "to_device", recording_to_device)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.random, "fork_rng", recording_fork)
    r = train(model, TASK, steps=3, n_train=64, n_val=32, batch_size=16)
    assert r.steps == 3
    assert forks == [([0], "cuda")]
    # 3 training batches + final evaluation of train (64 rows) and val (32 rows), one batch each
    assert sent == [torch.device("cuda", 0)] * 5
    sent.clear()
    evaluate(other, TASK.make(8, 1))
    assert sent == [torch.device("cuda", 0)]


def test_train_on_cpu_forks_only_the_cpu(monkeypatch, deterministic):
    forks = []
    real_fork = torch.random.fork_rng

    def recording_fork(devices=None, enabled=True, device_type=None, **kw):
        forks.append((list(devices), device_type))
        return real_fork(devices=devices, enabled=enabled, device_type=device_type)

    model = _model()
    cuda_seeded = []  # torch.manual_seed would re-seed every CUDA device, unforked here
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda s: cuda_seeded.append(s))
    monkeypatch.setattr(torch.random, "fork_rng", recording_fork)
    state = torch.random.get_rng_state()
    train(model, TASK, steps=2, n_train=32, n_val=0, batch_size=16)
    assert forks == [([], None)] and cuda_seeded == []
    assert torch.equal(torch.random.get_rng_state(), state)


def test_seed_everything_sets_cublas_workspace_only_on_cuda_and_only_if_unset(monkeypatch, deterministic):
    seeded = []  # torch.manual_seed seeds every CUDA device through torch.cuda.manual_seed_all
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda s: seeded.append(s))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "placeholder")  # restored after the test
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    helpers.seed_everything(0)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ and seeded == [0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    helpers.seed_everything(2, deterministic=False)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ  # only deterministic cuBLAS needs it
    helpers.seed_everything(5)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and seeded == [0, 2, 5]
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the caller's choice wins
    helpers.seed_everything(1)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_induction_score_follows_the_maps_device():
    """CPU token ids with maps elsewhere (meta stands in for CUDA): computed where the maps are."""
    w = torch.rand(2, 3, 2, 5, 5, device="meta")
    tokens = torch.randint(0, 4, (3, 5))
    s = induction_score(w, tokens, query_mask=torch.ones(3, 5, dtype=torch.bool))
    assert s.device.type == "meta" and s.shape == (2, 2)
    assert attention_at_offset(w, 1, query_mask=torch.ones(3, 5, dtype=torch.bool)).device.type == "meta"


def test_head_importance_moves_batches_to_the_model_device(monkeypatch):
    import helpers.heads as heads_mod

    sent = []
    real = heads_mod.to_device
    monkeypatch.setattr(heads_mod, "to_device", lambda batch, device: (sent.append(device), real(batch, device))[1])
    model = TinyTransformer(10, 16, 2, 2, 12, pos="rope", seed=0).eval()
    data = [TASK.make(4, s) for s in (0, 1)]  # token ids < 6 <= the model's vocabulary of 10
    imp = head_importance(model, data)
    assert imp.shape == (2, 2) and sent == [torch.device("cpu")] * 2
    attention_maps(model, data[0][0])
    assert sent[-1] == torch.device("cpu")


def test_tiny_transformer_seed_leaves_cuda_generators_alone(monkeypatch):
    """seed= re-seeds only the CPU generator (init runs there): torch.manual_seed would also
    re-seed every CUDA device, which fork_rng(devices=[]) would not restore."""
    calls = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda s: calls.append(s))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda s: calls.append(s))
    a, b = _model(3), _model(3)
    assert calls == []
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)  # the same CPU stream as torch.manual_seed(3) would give
        c = TinyTransformer(TASK.vocab_size, 32, 2, 1, TASK.seq_len, pos="rope")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_rope_cache_key_of_an_index_less_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert _device_key("cuda") == _device_key("cuda:0") == torch.device("cuda", 0)


# ---------------------------------------------------------------- on a real GPU
@needs_cuda
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_on_cuda_equals_cpu(layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 17, 16, generator=g)
    pos = torch.randint(0, 500, (3, 17), generator=g)
    for kw in ({}, {"positions": pos}, {"positions": pos[0]}, {"positions": pos / 3.0}):
        ref = apply_rope(x, layout=layout, **kw)
        out = apply_rope(x.cuda(), layout=layout, **{k: v.cuda() for k, v in kw.items()})
        assert out.device.type == "cuda"
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
        if layout == "interleaved":
            torch.testing.assert_close(apply_rope_complex(x.cuda(), **kw).cpu(), apply_rope_complex(x, **kw), rtol=1e-5, atol=1e-5)
    rope = RotaryEmbedding(16, layout=layout)
    torch.testing.assert_close(rope(x.cuda(), pos).cpu(), rope(x, pos), rtol=1e-5, atol=1e-5)


@needs_cuda
def test_rope_cache_per_device():
    rope = RotaryEmbedding(16, initial_cache_len=8)
    rope(torch.randn(2, 40, 16, device="cuda"))
    here = torch.device("cuda", torch.cuda.current_device())
    assert rope.cache_len(device="cuda") == rope.cache_len(device=here) >= 40
    assert rope.cache_len(device=torch.device("cuda")) >= 40
    assert rope.cache_len(device="cpu") == 0
    rope(torch.randn(2, 5, 16))
    assert rope.cache_len(device="cpu") >= 5 and rope.cache_len(device="cuda") >= 40


@needs_cuda
def test_mha_on_cuda_equals_torch_on_cuda():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(32, 4, batch_first=True).cuda().eval()
    mha = MultiHeadAttention.from_torch(ref).eval()
    assert next(mha.parameters()).device.type == "cuda"
    q = torch.randn(2, 7, 32, device="cuda")
    kv = torch.randn(2, 9, 32, device="cuda")
    pad = torch.ones(2, 1, 1, 9, dtype=torch.bool, device="cuda")
    pad[1, ..., 6:] = False
    with torch.no_grad():
        out, w = mha(q, kv, kv, mask=pad)
        r_out, r_w = ref(q, kv, kv, key_padding_mask=~pad[:, 0, 0], average_attn_weights=False)
        torch.testing.assert_close(out, r_out, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(w, r_w, rtol=1e-4, atol=1e-5)
        causal = causal_mask(7, device="cuda")
        out, w = mha(q, mask=causal)
        r_out, r_w = ref(q, q, q, attn_mask=~causal, average_attn_weights=False)
        torch.testing.assert_close(out, r_out, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(w, r_w, rtol=1e-4, atol=1e-5)


@needs_cuda
def test_train_on_cuda_from_cpu_data_leaves_the_callers_rng_alone(deterministic):
    torch.use_deterministic_algorithms(False)  # restored by the fixture; cuBLAS determinism is seed_everything's job
    model = _model().cuda()
    cpu_state, cuda_states = torch.random.get_rng_state(), torch.cuda.get_rng_state_all()
    r = train(model, TASK, steps=20, n_train=256, n_val=64, batch_size=32)  # the task's tensors are on the CPU
    assert r.steps == 20 and all(torch.isfinite(torch.tensor(r.losses)))
    assert r.losses[-1] < r.losses[0]
    assert torch.equal(torch.random.get_rng_state(), cpu_state)
    assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), cuda_states))
    loss, acc = evaluate(model, TASK.make(64, 3))
    assert 0.0 <= acc <= 1.0 and loss == loss


@needs_cuda
def test_head_importance_and_maps_on_a_cuda_model():
    cpu_model = TinyTransformer(10, 16, 2, 2, 12, pos="rope", seed=0).eval()
    cuda_model = TinyTransformer(10, 16, 2, 2, 12, pos="rope", seed=0).cuda().eval()
    data = [TASK.make(8, s) for s in (0, 1)]  # CPU batches, token ids < 6 <= vocabulary 10
    imp = head_importance(cuda_model, data)
    assert imp.device.type == "cuda"
    torch.testing.assert_close(imp.cpu(), head_importance(cpu_model, data), rtol=1e-3, atol=1e-5)
    w = attention_maps(cuda_model, data[0][0])
    assert w.device.type == "cuda"
    s = induction_score(w, data[0][0])
    torch.testing.assert_close(s.cpu(), induction_score(attention_maps(cpu_model, data[0][0]), data[0][0]), rtol=1e-3, atol=1e-5)
