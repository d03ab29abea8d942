r"""Diagnosing checker for the KV-cache decoding exercise of notebook 07 ("write it from memory").

:func:`check_kv_decode_step` runs the learner's one-token decoding step with RoPE,
``decode_step(q, k, v, k_cache, v_cache)``, against a reference made of the series' parts
(:class:`helpers.kvcache.KVCache`, :func:`helpers.rope.apply_rope`,
:func:`helpers.attention.scaled_dot_product_attention` with the last row of the causal mask, as
:func:`helpers.kvcache.cached_attention` does); the tests check that reference against the
last row of full causal attention recomputed on the whole sequence with
``F.scaled_dot_product_attention(is_causal=True)``.

The step, with :math:`p` = ``k_cache.shape[-2]`` tokens cached (the new token's position):

.. math::
    q \leftarrow R_p\,q,\quad k \leftarrow R_p\,k,\quad
    K = [K_\text{cache}; k],\; V = [V_\text{cache}; v],\quad
    \text{out} = \operatorname{softmax}(q K^\top/\sqrt{d})\,V

(the new token sees every cached key and itself). Keys are cached **already rotated**, values
never rotated. RoPE: interleaved layout, base 10000 (``helpers.apply_rope``'s defaults; the
learner may call it). Worked solution: :func:`kv_decode_step_solution`; planted mistakes:
:data:`KV_DECODE_MISTAKES`.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..attention import scaled_dot_product_attention
from ..kvcache import KVCache
from ..rope import apply_rope
from .engine import CheckResult, Reject, TestInput, as_tensor_result, clone_args, run_check

__all__ = ["check_kv_decode_step", "kv_decode_step_solution", "KV_DECODE_MISTAKES", "KV_DECODE_ADVICE"]


def kv_decode_step_solution(q, k, v, k_cache, v_cache):
    """Worked solution: rotate the new q, k at position p = len(cache), append, attend to everything cached.

    ``q``, ``k``, ``v`` ``(B, H, 1, d)`` (before RoPE); ``k_cache``, ``v_cache`` ``(B, H, p, d)``
    (keys rotated). Returns ``(out (B, H, 1, d), k_cache (B, H, p+1, d), v_cache (B, H, p+1, d))``.
    """
    p = k_cache.shape[-2]                                   # tokens already cached = the new token's position
    pos = torch.tensor([p])
    q, k = apply_rope(q, pos), apply_rope(k, pos)
    k_cache = torch.cat([k_cache, k], dim=-2)               # cached rotated, never rotated again
    v_cache = torch.cat([v_cache, v], dim=-2)
    w = torch.softmax(q @ k_cache.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)  # sees all p + 1 keys
    return w @ v_cache, k_cache, v_cache


def _attend(q, K, V, allowed=None, scale=True):
    scores = q @ K.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


def _step(q, k, v, k_cache, v_cache, *, pos, layout="interleaved", allowed=None, scale=True):
    """Rotate the new q, k at ``pos``, append k, v to the cache, attend: the solution's shape, one knob turned."""
    position = torch.tensor([pos])
    q, k = apply_rope(q, position, layout=layout), apply_rope(k, position, layout=layout)
    K, V = torch.cat([k_cache, k], dim=-2), torch.cat([v_cache, v], dim=-2)
    return _attend(q, K, V, allowed, scale), K, V


def _at_position_0(q, k, v, k_cache, v_cache):
    return _step(q, k, v, k_cache, v_cache, pos=0)  # the new token is row 0 of its input, not token 0


def _rotated_twice(q, k, v, k_cache, v_cache):
    p = k_cache.shape[-2]
    K = apply_rope(torch.cat([k_cache, k], dim=-2), torch.arange(p + 1))  # rotates the cached keys again
    V = torch.cat([v_cache, v], dim=-2)
    q = apply_rope(q, torch.tensor([p]))
    return _attend(q, K, V), K, V


def _key_cached_unrotated(q, k, v, k_cache, v_cache):
    p = k_cache.shape[-2]
    pos = torch.tensor([p])
    q, k_rot = apply_rope(q, pos), apply_rope(k, pos)
    V = torch.cat([v_cache, v], dim=-2)
    out = _attend(q, torch.cat([k_cache, k_rot], dim=-2), V)
    return out, torch.cat([k_cache, k], dim=-2), V         # the raw key goes into the cache


def _values_rotated(q, k, v, k_cache, v_cache):
    p = k_cache.shape[-2]
    pos = torch.tensor([p])
    q, k, v = apply_rope(q, pos), apply_rope(k, pos), apply_rope(v, pos)
    K, V = torch.cat([k_cache, k], dim=-2), torch.cat([v_cache, v], dim=-2)
    return _attend(q, K, V), K, V


def _query_not_rotated(q, k, v, k_cache, v_cache):
    p = k_cache.shape[-2]
    k = apply_rope(k, torch.tensor([p]))
    K, V = torch.cat([k_cache, k], dim=-2), torch.cat([v_cache, v], dim=-2)
    return _attend(q, K, V), K, V


def _top_left_causal(q, k, v, k_cache, v_cache):
    p = k_cache.shape[-2]
    allowed = torch.ones(1, p + 1, dtype=torch.bool).tril()  # (Lq=1, Lk=p+1) aligned top-left: key 0 only
    return _step(q, k, v, k_cache, v_cache, pos=p, allowed=allowed)


def _position_plus_one(q, k, v, k_cache, v_cache):
    return _step(q, k, v, k_cache, v_cache, pos=k_cache.shape[-2] + 1)  # one too far: cached tokens sit at 0 .. p-1


def _half_layout(q, k, v, k_cache, v_cache):
    return _step(q, k, v, k_cache, v_cache, pos=k_cache.shape[-2], layout="half")  # the cache is interleaved


def _unscaled(q, k, v, k_cache, v_cache):
    return _step(q, k, v, k_cache, v_cache, pos=k_cache.shape[-2], scale=False)  # no 1/sqrt(d)


KV_DECODE_MISTAKES: dict[str, Callable] = {
    "new_token_at_position_0": _at_position_0,
    "cached_keys_rotated_twice": _rotated_twice,
    "new_key_cached_unrotated": _key_cached_unrotated,
    "values_rotated": _values_rotated,
    "query_not_rotated": _query_not_rotated,
    "top_left_causal_mask": _top_left_causal,
    "position_plus_one": _position_plus_one,
    "half_layout_for_the_new_token": _half_layout,
    "scores_not_scaled": _unscaled,
}

KV_DECODE_ADVICE: dict[str, str] = {
    "position_plus_one": (
        "Position off by one (position_plus_one): with p tokens cached at positions 0 .. p-1, the new token sits "
        "at p = k_cache.shape[-2], not p + 1."
    ),
    "half_layout_for_the_new_token": (
        "Layout mixed (half_layout_for_the_new_token): the cached keys were rotated in the interleaved layout "
        "(apply_rope's default); rotating the new q, k with layout='half' pairs other dimensions, so their scores "
        "against the cache are wrong. Use one layout for the whole sequence."
    ),
    "scores_not_scaled": (
        "Scores not scaled (scores_not_scaled): divide q @ K^T by sqrt(d) before the softmax, as in any attention."
    ),
    "new_token_at_position_0": (
        "New token rotated at position 0 (new_token_at_position_0): it is the only row of its input, but its "
        "position in the sequence is p = k_cache.shape[-2] (the number of cached tokens). Rotate q and k by "
        "apply_rope(..., positions=torch.tensor([p]))."
    ),
    "cached_keys_rotated_twice": (
        "Cached keys rotated twice (cached_keys_rotated_twice): the cache holds keys already rotated at their "
        "positions; rotating the concatenation [k_cache; k] by 0 .. p rotates token j by 2 j theta. Rotate "
        "only the new key (at p), then append it."
    ),
    "new_key_cached_unrotated": (
        "New key cached before RoPE (new_key_cached_unrotated): this step's output is right, but the cache "
        "gets the raw key, so from the next step on every query sees that key as if it sat at position 0. Append the rotated key "
        "(Hugging Face: cache.update after apply_rotary_pos_emb)."
    ),
    "values_rotated": (
        "Values rotated (values_rotated): RoPE rotates queries and keys only (their dot product then depends "
        "on the offset); values are appended as they are."
    ),
    "query_not_rotated": (
        "Query not rotated (query_not_rotated): both sides of q.k need RoPE: rotate the new query at p too."
    ),
    "top_left_causal_mask": (
        "Causal mask aligned top-left (top_left_causal_mask): torch.ones(1, p + 1).tril() (what "
        "F.scaled_dot_product_attention(is_causal=True) builds for Lq != Lk) lets the new token see key 0 only. "
        "The new query is the LAST row of the causal mask: it sees all p + 1 keys (no mask needed for one token; "
        "for n new tokens, tril() of the (p+n, p+n) mask, last n rows)."
    ),
}


def _kv_call(f: Callable) -> Callable:
    def run(q, k, v, k_cache, v_cache):
        out = f(*clone_args([q, k, v, k_cache, v_cache]))
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
            raise Reject("interface", f"your function must return (output, k_cache, v_cache), got {got}", float("inf"))
        p1 = k_cache.shape[-2] + 1
        o, kc, vc = (as_tensor_result(t, what) for t, what in zip(out, (
            f"the output, shape {tuple(q.shape)}", f"the keys, shape {tuple(k.shape[:2]) + (p1, k.shape[-1])}",
            f"the values, shape {tuple(v.shape[:2]) + (p1, v.shape[-1])}")))
        return {"output": o, "k_cache": kc, "v_cache": vc}

    return run


def _kv_reference(q, k, v, k_cache, v_cache):
    p = k_cache.shape[-2]
    cache = KVCache(1)
    if p:
        cache.update(0, k_cache, v_cache)
    pos = torch.tensor([p])
    q, k = apply_rope(q, pos), apply_rope(k, pos)
    K, V = cache.update(0, k, v)
    allowed = torch.ones(p + 1, p + 1, dtype=torch.bool).tril()[p:]  # the causal mask's last row
    out, _ = scaled_dot_product_attention(q, K, V, mask=allowed)
    return {"output": out, "k_cache": K, "v_cache": V}


def kv_step_inputs(B: int, H: int, p: int, d: int, g: torch.Generator):
    """Raw (pre-RoPE) q, k, v for ``p + 1`` tokens ``(B, H, p+1, d)`` and the step's arguments built from them:
    the last token's q, k, v, and the first ``p`` keys rotated at ``0 .. p-1`` and values, as the cache."""
    qa, ka, va = (torch.randn(B, H, p + 1, d, generator=g) * 2 for _ in range(3))
    k_cache = apply_rope(ka[..., :p, :], torch.arange(p))
    return (qa, ka, va), (qa[..., p:, :], ka[..., p:, :], va[..., p:, :], k_cache, va[..., :p, :].clone())


def _kv_inputs(seed: int) -> list[TestInput]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for B, H, p, d in [(2, 2, 5, 8), (1, 1, 0, 4), (1, 3, 7, 6), (2, 2, 40, 16)]:
        _, args = kv_step_inputs(B, H, p, d, g)
        label = f"with (B, H, d) = ({B}, {H}, {d}) and {p} cached tokens" + (" (an empty cache)" if p == 0 else "")
        out.append(TestInput(label, args, "decode_step(q, k, v, k_cache, v_cache)"))
    return out


def check_kv_decode_step(fn: Callable, seed: int = 0) -> CheckResult:
    r"""Check the learner's KV-cache decoding step with RoPE.

    ``fn(q, k, v, k_cache, v_cache)``: the new token's ``q``, ``k``, ``v`` ``(B, H, 1, d)``
    before RoPE, the cache ``(B, H, p, d)`` (keys rotated at ``0 .. p-1``); returns
    ``(output (B, H, 1, d), k_cache (B, H, p+1, d), v_cache (B, H, p+1, d))`` (module
    docstring). All three are compared. Inputs: 5, 0 (empty cache), 7 and 40 cached tokens,
    batch 1 and 2, 1 to 3 heads, ``d`` = 4 to 16. Planted mistakes: :data:`KV_DECODE_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    return run_check(
        fn, _kv_call, _kv_reference, KV_DECODE_MISTAKES, KV_DECODE_ADVICE, _kv_inputs(seed),
        unknown_hint="Check: p = k_cache.shape[-2]; rotate q and k at position p only; append k (rotated) and v "
                     "(as is); softmax(q K^T / sqrt(d)) V over all p + 1 keys.",
        pass_message="PASS: your decoding step equals the reference (KVCache + apply_rope + attention; = the last "
                     "row of full causal attention) with 0, 5, 7 and 40 cached tokens: output, keys and values.",
    )
