"""Regression tests for the RoPE helper fixes: position dtypes, meta tensors, tables built under
inference_mode, bfloat16 training of MultiHeadAttention(rope=True), and rope_inv_freq as a
float32 buffer that survives state_dict() and dtype casts."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from helpers import rope as R
from helpers.attention import MultiHeadAttention
from helpers.model import TinyTransformer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("call", ["apply_rope", "apply_rope_half", "apply_rope_complex", "RotaryEmbedding", "MHA"])
def test_low_precision_positions_are_refused(call, dtype):
    x = torch.randn(1, 2, 4, 8)
    pos = torch.arange(3000, 3004).to(dtype)
    fn = {"apply_rope": lambda: R.apply_rope(x, pos), "apply_rope_half": lambda: R.apply_rope(x, pos, layout="half"),
          "apply_rope_complex": lambda: R.apply_rope_complex(x, pos),
          "RotaryEmbedding": lambda: R.RotaryEmbedding(8)(x, pos),
          "MHA": lambda: MultiHeadAttention(16, 2, rope=True)(torch.randn(1, 4, 16), positions=pos)}[call]
    with pytest.raises(TypeError, match=rf"positions must be an integer, float32 or float64 tensor .*got dtype {dtype}"):
        fn()


def test_bool_positions_are_refused():
    with pytest.raises(TypeError, match="positions must be an integer or real floating-point tensor, got dtype torch.bool"):
        R.apply_rope(torch.randn(1, 2, 2, 8), torch.tensor([True, False]))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_explicit_positions_on_meta(layout):
    x = torch.randn(2, 4, 16, 8, device="meta")
    for pos in (torch.arange(16), torch.arange(16, device="meta"), torch.arange(32).view(2, 16)):
        assert R.apply_rope(x, pos, layout=layout).shape == x.shape
        assert R.apply_rope(x, pos, layout=layout, frequencies=R.rope_frequencies(8)).shape == x.shape
        assert R.RotaryEmbedding(8, layout=layout)(x, pos).shape == x.shape
        assert R.apply_rope_complex(x, pos).shape == x.shape
    mha = MultiHeadAttention(32, 4, rope=True, rope_layout=layout).to("meta")
    assert mha(torch.randn(2, 16, 32, device="meta"), positions=torch.arange(16))[0].shape == (2, 16, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tables_built_under_inference_mode_serve_training(dtype):
    R._cached_tables.cache_clear()
    rot = R.RotaryEmbedding(8, initial_cache_len=4)
    x = torch.randn(1, 2, 37, 8).to(dtype)
    with torch.inference_mode():
        first = (R.apply_rope(x), rot(x), rot(x, torch.arange(37)))
    xg = x.clone().requires_grad_()
    for out, ref in zip((R.apply_rope(xg), rot(xg), rot(xg, torch.arange(37))), first):
        out.float().square().sum().backward()
        torch.testing.assert_close(out.detach(), ref, atol=0, rtol=0)
    assert xg.grad is not None


def test_bf16_mha_rope_training_step():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, rope=True).bfloat16()
    opt = torch.optim.SGD(mha.parameters(), lr=0.1)
    x = torch.randn(2, 16, 32).bfloat16()
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    before = mha.linear_q.weight.detach().clone()
    out, _ = mha(x, mask=mask)
    loss = out.float().square().mean()
    loss.backward()
    assert mha.linear_q.weight.grad.dtype == torch.bfloat16 and mha.linear_q.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(before, mha.linear_q.weight)
    # the float32 module from the same weights gives the same output to bfloat16 precision
    ref = MultiHeadAttention(32, 4, rope=True)
    ref.load_state_dict({k: v.float() for k, v in mha.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(mha(x, mask=mask)[0].float(), ref(x.float(), mask=mask)[0], atol=5e-2, rtol=5e-2)


def test_interleaved_fp32_non_viewable_backward():
    x = torch.randn(2, 4, 16, 9)[..., 1:].detach().requires_grad_()  # odd storage offset: not complex-viewable
    assert x.storage_offset() % 2 == 1
    out = R.apply_rope(x, torch.arange(16) + 3)
    x64 = x.detach().double().requires_grad_()
    ref = R.apply_rope_matrix(x64, torch.arange(16) + 3)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ rope_inv_freq as a buffer
def _llama3_mha():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, bias=False, rope=True, rope_base=500000.0, rope_layout="half", num_kv_heads=2)
    mha.rope_inv_freq = R.llama3_frequencies(8, factor=8.0, original_max_position_embeddings=16)
    return mha


def test_rope_inv_freq_survives_state_dict_round_trip():
    mha = _llama3_mha()
    x = torch.randn(1, 100, 32)
    buf = io.BytesIO()
    torch.save(mha.state_dict(), buf)
    buf.seek(0)
    fresh = MultiHeadAttention(32, 4, bias=False, rope=True, rope_base=500000.0, rope_layout="half", num_kv_heads=2)
    assert fresh.rope_inv_freq is None
    fresh.load_state_dict(torch.load(buf))  # strict
    assert fresh.rope_inv_freq.dtype == torch.float32
    torch.testing.assert_close(fresh.rope_inv_freq, mha.rope_inv_freq, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x)[0], mha(x)[0], atol=0, rtol=0)
        plain = MultiHeadAttention(32, 4, bias=False, rope=True, rope_base=500000.0, rope_layout="half", num_kv_heads=2)
        plain.load_state_dict({k: v for k, v in mha.state_dict().items() if k != "rope_inv_freq"})
        assert (plain(x)[0] - mha(x)[0]).abs().max() > 1e-3  # the frequencies matter at these positions


def test_rope_inv_freq_stays_float32_under_casts():
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.bfloat16(), lambda m: m.half(), lambda m: m.double(),
                 lambda m: m.to("cpu", torch.float16)):
        mha = cast(_llama3_mha())
        assert mha.rope_inv_freq.dtype == torch.float32
        assert mha.linear_q.weight.dtype != torch.float32
        torch.testing.assert_close(mha.rope_inv_freq, _llama3_mha().rope_inv_freq, atol=0, rtol=0)
    sd = _llama3_mha().bfloat16().state_dict()
    assert sd["rope_inv_freq"].dtype == torch.float32 and sd["linear_q.weight"].dtype == torch.bfloat16


def test_old_state_dicts_load_strictly():
    plain = MultiHeadAttention(32, 4, rope=True)
    assert "rope_inv_freq" not in plain.state_dict()  # None: not saved, so old checkpoints still match
    MultiHeadAttention(32, 4, rope=True).load_state_dict(plain.state_dict())
    with pytest.raises(RuntimeError, match=r"size mismatch for rope_inv_freq: expected shape \(head_dim // 2,\) = \(4,\), got \(3,\)"):
        plain.load_state_dict({**plain.state_dict(), "rope_inv_freq": torch.ones(3)})
    with pytest.raises(RuntimeError, match='Missing key.*"rope_inv_freq"'):  # a rescaled module needs its frequencies
        _llama3_mha().load_state_dict(plain.state_dict())


def test_committed_tiny_transformer_checkpoint_loads():
    path = Path(__file__).resolve().parents[1] / "experiments" / "results" / "05_mixed_model.pt"
    if not path.exists():
        pytest.skip("experiments/results/05_mixed_model.pt not present")
    sd = torch.load(path)
    assert not any(k.endswith("rope_inv_freq") for k in sd)
    import importlib.util
    spec = importlib.util.spec_from_file_location("ex05_ckpt", path.parents[1] / "05_head_redundancy_sweeps.py")
    ex05 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex05)
    task, _, test = ex05.mixed_data(0)
    model = TinyTransformer(task.vocab_size, max_len=task.seq_len, seed=0, **ex05.MIXED)
    model.load_state_dict(sd)  # strict: the rope modules' rope_inv_freq is None, so no key is expected
    model.bfloat16()
    assert all(b.attn.rope_inv_freq is None for b in model.blocks)


# ------------------------------------------------- frequencies= on meta, rope_angles position dtypes
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_given_frequencies_on_meta(layout):
    """Meta tensors hold no values: the finiteness check of `frequencies` must not read them."""
    x = torch.empty(2, 4, 16, 8, device="meta")
    freqs = R.llama3_frequencies(8, factor=8.0, original_max_position_embeddings=16).to("meta")
    for pos in (None, torch.arange(16), torch.arange(16, device="meta")):
        out = R.apply_rope(x, pos, layout=layout, frequencies=freqs)
        assert out.device.type == "meta" and out.shape == x.shape


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_mha_with_rope_inv_freq_on_meta(layout):
    mha = MultiHeadAttention(32, 4, rope=True, rope_layout=layout)
    mha.rope_inv_freq = R.llama3_frequencies(8, factor=8.0, original_max_position_embeddings=16)
    mha = mha.to("meta")
    assert mha.rope_inv_freq.device.type == "meta" and mha.rope_inv_freq.dtype == torch.float32
    x = torch.empty(2, 16, 32, device="meta")
    for pos in (None, torch.arange(16)):
        out, _ = mha(x, positions=pos)
        assert out.device.type == "meta" and out.shape == (2, 16, 32)


def test_non_finite_frequencies_are_still_refused():
    bad = R.rope_frequencies(8).clone()
    bad[1] = float("nan")
    with pytest.raises(ValueError, match="frequencies must be a finite floating-point tensor"):
        R.apply_rope(torch.randn(1, 4, 8), frequencies=bad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rope_angles_refuses_low_precision_positions(dtype):
    """bfloat16 arange(3000, 3016) holds only two values near 3000 (spacing 16): rope_angles would
    silently return angles of rounded positions."""
    pos = torch.arange(3000, 3016).to(dtype)
    with pytest.raises(TypeError, match=rf"positions must be an integer, float32 or float64 tensor .*got dtype {dtype}"):
        R.rope_angles(pos, 4)


def test_rope_angles_accepts_exact_positions():
    for pos in (torch.arange(3000, 3016), torch.arange(3000, 3016).float(), torch.arange(3000, 3016).double(),
                list(range(3000, 3016)), 16):
        ang = R.rope_angles(pos, 4)
        assert ang.dtype == torch.float32 and ang.shape == (16, 2)
    torch.testing.assert_close(R.rope_angles(torch.arange(3000, 3016), 4)[:, 0], torch.arange(3000, 3016).float())
