"""What notebook 02 quotes from the pinned Hugging Face ``transformers`` (5.24.0), checked against
the installed source and run against ``helpers.rope``.

* Section 5 quotes ``LlamaRotaryEmbedding.forward`` (float32 angles by an element-wise product,
  cast to the model dtype after cos/sin) and says the older autocast guard is gone.
* Section 4 quotes GPT-NeoX's partial rotary (``partial_rotary_factor``, ``rotary_pct`` 0.25 by
  default): frequencies over the rotated width, half layout on the first ``rotary_dim``
  dimensions, the rest passed through; the notebook does the same with ``helpers.apply_rope``.

If a transformers upgrade changes these lines, the quote tests fail and the notebook's text must
be re-read against the new source.
"""
from __future__ import annotations

import inspect
import re

import pytest
import torch

from helpers import apply_rope, rope_frequencies


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    """transformers is imported when this module's first test runs, not at collection (see test_huggingface.py)."""
    global transformers, GPTNeoXConfig, LlamaConfig, modeling_gpt_neox, modeling_llama
    transformers = pytest.importorskip("transformers")
    from transformers import GPTNeoXConfig, LlamaConfig
    from transformers.models.gpt_neox import modeling_gpt_neox
    from transformers.models.llama import modeling_llama


def squash(src: str) -> str:
    return re.sub(r"\s+", " ", src)


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_pinned_version():
    assert transformers.__version__ == "5.24.0", "notebook 02 quotes transformers 5.24.0: re-read the quotes for this version"


def test_llama_rotary_forward_is_quoted_verbatim():
    src = squash(inspect.getsource(modeling_llama.LlamaRotaryEmbedding.forward))
    for line in (
        "freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)",
        "emb = torch.cat((freqs, freqs), dim=-1)",
        "cos = emb.cos() * self.attention_scaling",
        "sin = emb.sin() * self.attention_scaling",
        "return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)",
    ):
        assert squash(line) in src, line
    assert "autocast" not in src and "Force float32" not in src
    init_src = squash(inspect.getsource(modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters))
    assert "torch.arange(0, dim, 2, dtype=torch.float)" in init_src


def test_llama_rotary_keeps_float32_angles_under_bfloat16_autocast():
    config = LlamaConfig(hidden_size=256, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1, vocab_size=10)
    rope = modeling_llama.LlamaRotaryEmbedding(config)  # head_dim 128, base 10000
    x = torch.zeros(1, 4096, 256)
    position_ids = torch.arange(4096)[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = rope(x, position_ids)
    cos_plain, sin_plain = rope(x, position_ids)
    assert cos.dtype == torch.float32 and torch.equal(cos, cos_plain) and torch.equal(sin, sin_plain)
    torch.testing.assert_close(rope.inv_freq, rope_frequencies(128), rtol=1e-6, atol=0)
    angle = torch.arange(4096, dtype=torch.float32)[:, None] * rope.inv_freq  # float32 angles, as the quote says
    torch.testing.assert_close(cos[0], torch.cat([angle.cos(), angle.cos()], -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[0], torch.cat([angle.sin(), angle.sin()], -1), rtol=0, atol=1e-6)


def test_gpt_neox_partial_rotary_is_quoted_verbatim():
    src = squash(inspect.getsource(modeling_gpt_neox.apply_rotary_pos_emb))
    for line in (
        "rotary_dim = cos.shape[-1]",
        "q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]",
        "q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)",
        "q_embed = torch.cat([q_embed, q_pass], dim=-1)",
    ):
        assert squash(line) in src, line
    init_src = squash(inspect.getsource(modeling_gpt_neox.GPTNeoXRotaryEmbedding.compute_default_rope_parameters))
    assert "dim = int(head_dim * partial_rotary_factor)" in init_src
    config = GPTNeoXConfig(hidden_size=256, num_attention_heads=4, intermediate_size=64, num_hidden_layers=1, vocab_size=10)
    assert config.rope_parameters["partial_rotary_factor"] == 0.25  # rotary_pct's default
    assert GPTNeoXConfig(rotary_pct=0.5).rope_parameters["partial_rotary_factor"] == 0.5


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0])
def test_gpt_neox_partial_rotary_equals_apply_rope_on_the_first_dims(factor):
    head_dim, heads, seq = 64, 4, 50
    config = GPTNeoXConfig(hidden_size=head_dim * heads, num_attention_heads=heads, intermediate_size=64,
                           num_hidden_layers=1, vocab_size=10, rotary_pct=factor)
    rope = modeling_gpt_neox.GPTNeoXRotaryEmbedding(config)
    rotary_dim = int(head_dim * factor)
    q, k = randn(1, heads, seq, head_dim, seed=1), randn(1, heads, seq, head_dim, seed=2)
    positions = torch.arange(seq) + 7
    cos, sin = rope(q, positions[None])
    assert cos.shape[-1] == rotary_dim
    q_hf, k_hf = modeling_gpt_neox.apply_rotary_pos_emb(q, k, cos, sin)

    def partial_rope(t):  # notebook 02, section 4
        return torch.cat([apply_rope(t[..., :rotary_dim], positions, layout="half"), t[..., rotary_dim:]], dim=-1)

    torch.testing.assert_close(q_hf, partial_rope(q), rtol=0, atol=1e-5)
    torch.testing.assert_close(k_hf, partial_rope(k), rtol=0, atol=1e-5)
    assert torch.equal(q_hf[..., rotary_dim:], q[..., rotary_dim:])
    # the frequencies use the rotated width, not head_dim
    torch.testing.assert_close(rope.inv_freq, rope_frequencies(rotary_dim), rtol=1e-6, atol=0)
