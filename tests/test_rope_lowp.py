"""float16/bfloat16 input on the default path of ``helpers.rope``: PyTorch operators, float32 arithmetic,
one rounding back (Meta's Llama recipe), no compiled library.

The references are independent of the code under test: the float64 rotation of the same rounded
input (``apply_rope(x.double())``, itself checked against the matrix form in ``tests/test_rope.py``)
and the inverse rotation for the gradient. The opt-in fused kernel is ``tests/test_rope_kernel.py``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.attention import MultiHeadAttention
from helpers.lab.traffic import memory_traffic
from helpers.rope import RotaryEmbedding, apply_rope, apply_rope_complex, rope_frequencies

LOWP = [torch.bfloat16, torch.float16]
LAYOUTS = ["interleaved", "half"]
ROOT = Path(__file__).resolve().parents[1]


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def exact_rotation(x: torch.Tensor, positions, layout: str) -> torch.Tensor:
    """The rotation of the (rounded) ``x`` by the float32 angles, cos and sin apply_rope uses, computed in
    float64: what float32 arithmetic rounded once approximates, with its angles taken as given."""
    pos = positions.float()
    ang = (pos[..., None] * rope_frequencies(x.shape[-1])) if pos.dim() == 1 else (pos[:, None, :, None] * rope_frequencies(x.shape[-1]))
    c, s = ang.cos().double(), ang.sin().double()
    x64, h = x.double(), x.shape[-1] // 2
    a, b = (x64[..., 0::2], x64[..., 1::2]) if layout == "interleaved" else (x64[..., :h], x64[..., h:])
    ya, yb = a * c - b * s, b * c + a * s
    return torch.stack((ya, yb), -1).flatten(-2) if layout == "interleaved" else torch.cat((ya, yb), -1)


def rounded_once(out: torch.Tensor, exact: torch.Tensor, x: torch.Tensor) -> bool:
    """``out`` is ``exact`` rounded to ``out.dtype`` once, up to the float32 rounding of the products:
    |out - exact| <= half an ulp of ``out.dtype`` at ``exact`` plus 2^-22 of the row's largest |x|."""
    e = exact.abs().to(out.dtype)
    half_ulp = (torch.nextafter(e, torch.full_like(e, float("inf"))).double() - e.double()) / 2
    slack = 2.0**-22 * x.double().abs().amax(-1, keepdim=True)
    return bool(((out.double() - exact).abs() <= half_ulp * 1.0001 + slack).all())


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 1e-2), (torch.bfloat16, 6e-2)], ids=["f16", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_low_precision_inputs_use_float32_angles(dtype, atol, layout):
    x = randn(2, 5000, 16).to(dtype)
    truth = apply_rope(x.double(), layout=layout)  # exact rotation of the same low-precision numbers
    for out in (apply_rope(x, layout=layout), RotaryEmbedding(16, layout=layout)(x)):
        assert out.dtype == dtype
        # angles computed in the low dtype would be off by radians at positions ~5000
        torch.testing.assert_close(out.double(), truth, rtol=0, atol=atol)
    if layout == "interleaved":
        out = apply_rope_complex(x)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), truth, rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["contiguous", "transposed", "odd offset", "5-d", "(batch, seq) positions"])
def test_float32_arithmetic_rounded_once(dtype, layout, kind):
    """Every output is the exact rotation of the same rounded input by the same float32 cos and sin, rounded
    once to x.dtype (up to the float32 rounding of the products), whatever the memory layout: one
    rounding, not one per operator."""
    g = torch.Generator().manual_seed(len(kind))
    pos = torch.arange(37) + 1000
    if kind == "transposed":
        x = torch.randn(2, 37, 3, 64, generator=g).transpose(1, 2)
    elif kind == "odd offset":
        x = torch.randn(2, 3, 37, 65, generator=g)[..., 1:]
    elif kind == "5-d":
        x = torch.randn(2, 2, 2, 37, 64, generator=g)
    else:
        x = torch.randn(2, 3, 37, 64, generator=g)
        if kind != "contiguous":
            pos = torch.randint(0, 5000, (2, 37), generator=g)
    x = (3 * x).to(dtype)
    out = apply_rope(x, pos, layout=layout)
    assert out.dtype == dtype and out.shape == x.shape
    assert rounded_once(out, exact_rotation(x, pos, layout), x)
    # Hugging Face's bfloat16 path rounds after every operator: the check above can fail
    if dtype == torch.bfloat16 and layout == "half" and kind == "contiguous":
        ang = pos.float()[:, None] * rope_frequencies(64)
        c, s = torch.cat([ang.cos(), ang.cos()], -1).to(dtype), torch.cat([ang.sin(), ang.sin()], -1).to(dtype)
        hf = x * c + torch.cat([-x[..., 32:], x[..., :32]], -1) * s
        assert not rounded_once(hf, exact_rotation(x, pos, layout), x)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_is_the_inverse_rotation(dtype, layout):
    """dL/dx = R^T dL/dy = the rotation of the incoming gradient by the opposite angles, rounded once."""
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(2, 4, 16, 32, generator=g)).to(dtype).requires_grad_()
    w = (3 * torch.randn(2, 4, 16, 32, generator=g)).to(dtype)
    pos = torch.arange(16) + 100
    (apply_rope(x, pos, layout=layout) * w).sum().backward()
    assert x.grad.dtype == dtype
    assert rounded_once(x.grad, exact_rotation(w, -pos, layout), w)


def test_operator_counts_are_metas_recipe():
    """What appendix 02a §3 counts: interleaved = upcast copy, one complex multiply, downcast (3 operations,
    10.25 |x|); half = upcast, cat(cos, cos), multiply, two addcmul_, downcast (6 operations, 17 |x|)."""
    x = randn(1, 8, 256, 64).bfloat16()
    apply_rope(x)  # the table is memoised: the counts are those of a later call
    inter, half = memory_traffic(apply_rope, x), memory_traffic(lambda t: apply_rope(t, layout="half"), x)
    assert (inter["ops"], inter["traffic"]) == (3, 10.25)
    assert (half["ops"], half["traffic"]) == (6, 17.0)


def test_bf16_mha_rope_training_step():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, rope=True).bfloat16()
    opt = torch.optim.SGD(mha.parameters(), lr=0.1)
    x = torch.randn(2, 16, 32).bfloat16()
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    before = mha.linear_q.weight.detach().clone()
    out, _ = mha(x, mask=mask)
    out.float().square().mean().backward()
    assert mha.linear_q.weight.grad.dtype == torch.bfloat16 and mha.linear_q.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(before, mha.linear_q.weight)
    # the float32 module from the same weights gives the same output to bfloat16 precision
    ref = MultiHeadAttention(32, 4, rope=True)
    ref.load_state_dict({k: v.float() for k, v in mha.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(mha(x, mask=mask)[0].float(), ref(x.float(), mask=mask)[0], atol=5e-2, rtol=5e-2)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch's own jvp decompositions
def test_vmap_forward_mode_ad_and_angle_tangents():
    """Operators compose with torch.func and forward-mode AD: vmap gives the same bits, the tangent of x
    is rotated like x, and a tangent of learned frequencies reaches the output."""
    import torch.autograd.forward_ad as fwAD

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 16, generator=g).bfloat16()
    t = torch.randn(2, 3, 5, 16, generator=g).bfloat16()
    assert torch.equal(torch.func.vmap(apply_rope)(x), apply_rope(x))
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(apply_rope(fwAD.make_dual(x, t))).tangent
    assert torch.equal(tangent, apply_rope(t))
    theta, dtheta = rope_frequencies(16), torch.randn(8, generator=g)
    pos = torch.arange(5) + 7
    tangents = []
    for xx in (x, x.float()):
        with fwAD.dual_level():
            out = apply_rope(xx, pos, frequencies=fwAD.make_dual(theta, dtheta))
            tangents.append(fwAD.unpack_dual(out).tangent)
    assert tangents[0].dtype == torch.bfloat16 and tangents[0].abs().max() > 0.1
    torch.testing.assert_close(tangents[0].float(), tangents[1], atol=0.1, rtol=0.05)


def test_a_lazily_negated_input_is_rotated_as_its_values():
    """A neg-bit tensor (private API) holds -x in its metadata and +x in memory: the operators see -x."""
    x = randn(1, 2, 5, 8).bfloat16()
    neg = torch._neg_view(x)
    assert neg.is_neg()
    assert torch.equal(apply_rope(neg), apply_rope(-x))


def test_a_fresh_process_loads_no_compiled_library(tmp_path):
    """bfloat16/float16 apply_rope (both layouts, gradients, a MultiHeadAttention step) in a fresh process:
    the kernel's module is never imported, no library of its cache is mapped, no cache folder appears."""
    code = """
import sys, torch
from pathlib import Path
from helpers import MultiHeadAttention, RotaryEmbedding, apply_rope
for dt in (torch.bfloat16, torch.float16):
    x = torch.randn(2, 3, 7, 16).to(dt).requires_grad_()
    for layout in ("interleaved", "half"):
        apply_rope(x, layout=layout).float().sum().backward()
        apply_rope(x, torch.arange(7) + 100, layout=layout)
        RotaryEmbedding(16, layout=layout)(x)
    MultiHeadAttention(32, 2, rope=True).to(dt)(torch.randn(1, 5, 32).to(dt))[0].float().sum().backward()
maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
print("kernel module imported:", "helpers.lab.rope_kernel" in sys.modules)
print("library mapped:", "rope_lowp" in maps or "attention-notebooks" in maps)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["kernel module imported: False", "library mapped: False"], res.stdout
    assert not (tmp_path / "attention-notebooks").exists()
