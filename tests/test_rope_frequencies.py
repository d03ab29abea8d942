"""Per-pair RoPE frequencies: ``apply_rope(frequencies=...)`` and ``llama3_frequencies`` (notebook 07 §5).

The HF comparison of ``llama3_frequencies`` is in ``tests/test_huggingface.py``; here the rule itself
is checked against a direct transcription of Meta's ``apply_scaling`` (llama-models, Llama 3.1),
written with Python floats, and ``frequencies`` against the complex-number rotation.
"""
from __future__ import annotations

import math

import pytest
import torch

from helpers.rope import apply_rope, llama3_frequencies, rope_frequencies


def _meta_apply_scaling(freqs, factor=8.0, low=1.0, high=4.0, old_context_len=8192):
    """Meta's Llama 3.1 apply_scaling, one frequency at a time (plain Python)."""
    low_wavelen, high_wavelen = old_context_len / low, old_context_len / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


@pytest.mark.parametrize("head_dim, L", [(128, 8192), (64, 2048), (16, 32)])
def test_llama3_frequencies_follow_meta_apply_scaling(head_dim, L):
    plain = [500000.0 ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    ref = torch.tensor(_meta_apply_scaling(plain, old_context_len=L), dtype=torch.float64)
    torch.testing.assert_close(llama3_frequencies(head_dim, original_max_position_embeddings=L, dtype=torch.float64),
                               ref, rtol=1e-12, atol=0)
    ours = llama3_frequencies(head_dim, original_max_position_embeddings=L)
    assert ours.dtype == torch.float32 and ours.shape == (head_dim // 2,)
    assert bool((ours[1:] <= ours[:-1]).all())  # still decreasing: the blend is monotone


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_frequencies_argument(layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 16, generator=g)
    pos = torch.arange(5, 14)
    theta = rope_frequencies(16, 500000.0)
    torch.testing.assert_close(apply_rope(x, pos, layout=layout, frequencies=theta), apply_rope(x, pos, base=500000.0, layout=layout))
    torch.testing.assert_close(apply_rope(x, pos, layout=layout, frequencies=theta / 4),
                               apply_rope(x, pos, base=500000.0, layout=layout, scale=4.0))
    torch.testing.assert_close(apply_rope(x, pos, layout=layout, frequencies=theta, scale=4.0),
                               apply_rope(x, pos, layout=layout, frequencies=theta / 4))
    # against complex multiplication, with arbitrary frequencies
    f = torch.rand(8, generator=g)
    out = apply_rope(x, pos, layout=layout, frequencies=f)
    xi = x if layout == "interleaved" else torch.stack([x[..., :8], x[..., 8:]], -1).flatten(-2)
    z = torch.view_as_complex(xi.double().unflatten(-1, (8, 2)).contiguous()) * torch.polar(
        torch.ones(9, 8, dtype=torch.float64), pos[:, None].double() * f.double())
    ref = torch.view_as_real(z).flatten(-2)
    if layout == "half":
        ref = torch.cat([ref[..., 0::2], ref[..., 1::2]], -1)
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)
    # bfloat16 input: angles still float32 (frequencies cast to the angle dtype, not to x's)
    xb = x.to(torch.bfloat16)
    big = torch.tensor([4000])
    fb = rope_frequencies(16, 500000.0)
    ref32 = apply_rope(x[..., :1, :], big, layout=layout, frequencies=fb)
    torch.testing.assert_close(apply_rope(xb[..., :1, :], big, layout=layout, frequencies=fb).float(), ref32, atol=0.05, rtol=0.02)


def test_errors():
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"frequencies must have shape \(head_dim // 2,\) = \(4,\), got \(8,\)"):
        apply_rope(x, frequencies=torch.ones(8))
    with pytest.raises(TypeError, match="frequencies must be a torch.Tensor, got list"):
        apply_rope(x, frequencies=[1.0] * 4)
    with pytest.raises(ValueError, match="frequencies must be a finite floating-point tensor"):
        apply_rope(x, frequencies=torch.tensor([1.0, float("nan"), 1.0, 1.0]))
    with pytest.raises(ValueError, match="frequencies and ntk_scale cannot be combined"):
        apply_rope(x, frequencies=torch.ones(4), ntk_scale=2.0)
    with pytest.raises(ValueError, match="low_freq_factor must be < high_freq_factor, got 4.0 and 1.0"):
        llama3_frequencies(16, low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(ValueError, match="original_max_position_embeddings must be an int >= 1, got 0"):
        llama3_frequencies(16, original_max_position_embeddings=0)
    with pytest.raises(ValueError, match="factor must be a finite number > 0"):
        llama3_frequencies(16, factor=0.0)
    with pytest.raises(ValueError, match="head_dim must be even"):
        llama3_frequencies(15)
