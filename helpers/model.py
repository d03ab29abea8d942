r"""The tiny decoder-only transformer that notebooks 03-06 train on synthetic tasks.

Built in ``notebooks/03_mha_from_scratch.ipynb`` (section "the tiny transformer"),
then used by notebook 04 (residual dropout: ``dropout=p``), 05 (head pruning and
head importance: ``head_mask`` of shape ``(num_layers, num_heads)``, per-layer
``attention_weights``) and 06 (positional encodings compared: ``pos`` in
``{"none", "sinusoidal", "learned", "rope", "alibi"}``, shifted ``positions``/``offset``,
evaluation beyond ``max_len``).

Papers: Vaswani et al., "Attention Is All You Need" (2017) (sinusoidal encoding,
sec. 3.5; residual dropout, sec. 5.4); Xiong et al., "On Layer Normalization in the
Transformer Architecture" (2020) for the pre-LN block; Su et al. (2021) for RoPE.

Block (``norm="pre"``, the default; GPT-2 and most modern models):

.. math:: x \leftarrow x + \operatorname{Dropout}(\operatorname{Sublayer}(\operatorname{LN}(x)))

with a final LayerNorm before the output projection. The original paper's post-LN
block (``norm="post"``) is

.. math:: x \leftarrow \operatorname{LN}(x + \operatorname{Dropout}(\operatorname{Sublayer}(x))).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from .attention import MultiHeadAttention, causal_mask
from .kvcache import KVCache, greedy_generate
from .validate import check_choice, check_fraction, check_int

__all__ = ["POSITIONAL_ENCODINGS", "sinusoidal_encoding", "alibi_slopes", "alibi_bias", "TransformerBlock",
           "TinyTransformer"]

POSITIONAL_ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi")


def sinusoidal_encoding(positions: Union[int, torch.Tensor], d_model: int, base: float = 10000.0) -> torch.Tensor:
    r"""The sinusoidal position encoding of Vaswani et al. (2017), sec. 3.5.

    .. math::
        PE_{(p, 2i)} = \sin(p / \text{base}^{2i/d}), \qquad
        PE_{(p, 2i+1)} = \cos(p / \text{base}^{2i/d})

    (sine and cosine interleaved, as in the paper). Computed in float64 and returned as
    float32, so any position works, including positions beyond a training length.

    Args:
        positions: an int ``n`` (positions ``0 .. n-1``) or a tensor of positions of any
            shape ``(...)`` (ints or floats).
        d_model: even width.
        base: 10000 in the paper.

    Returns:
        Float32 tensor ``(..., d_model)`` (``(n, d_model)`` for an int).
    """
    check_int(d_model, "d_model")
    if d_model % 2 != 0:
        raise ValueError(f"d_model must be even for the sinusoidal encoding (sin/cos pairs), got {d_model}")
    if isinstance(positions, int) and not isinstance(positions, bool):
        positions = torch.arange(positions)
    pos = torch.as_tensor(positions).to(torch.float64)
    inv = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=pos.device) / d_model)
    angle = pos[..., None] * inv  # (..., d/2)
    pe = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(-2)
    return pe.to(torch.float32)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    r"""The head-specific slopes :math:`m_h` of ALiBi (Press, Smith & Lewis, ICLR 2022, sec. 3).

    For a power of two :math:`n` heads the slopes are the geometric sequence
    :math:`m_k = 2^{-8k/n}`, :math:`k = 1 .. n` (8 heads: :math:`1/2, 1/4, \dots, 1/256`).
    Otherwise, with :math:`p = 2^{\lfloor \log_2 n \rfloor}`, the first :math:`p` slopes are
    those of :math:`p` heads and the remaining :math:`n - p` are every second slope of
    :math:`2p` heads (:math:`m_1, m_3, \dots` of that sequence), as in the authors' code
    (``get_slopes`` in ``ofirpress/attention_with_linear_biases``, ``fairseq/models/transformer.py``).

    Args:
        num_heads: :math:`n`, an int >= 1.

    Returns:
        float64 tensor ``(num_heads,)``, decreasing for a power of two.
    """
    check_int(num_heads, "num_heads")

    def power_of_2(n: int) -> list[float]:
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    p = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    slopes = power_of_2(p)
    if p < num_heads:
        slopes += power_of_2(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(positions: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    r"""ALiBi's causal additive mask: :math:`-m_h (p_i - p_j)` where key :math:`j \le i`, else :math:`-\infty`.

    Press et al. (2022) add this bias to the query-key scores of every layer (eq. in sec. 3:
    :math:`\operatorname{softmax}(\mathbf q_i \mathbf K^\top + m \cdot [-(i-1), \dots, -2, -1, 0])`) and use
    no position embedding. It depends on positions only through :math:`p_i - p_j`, so a
    constant shift of every position changes nothing. Causality is by index, as for
    :func:`~helpers.attention.causal_mask`.

    Args:
        positions: ``(seq,)`` or ``(batch, seq)`` positions (ints or floats).
        slopes: ``(heads,)`` slopes :math:`m_h` (:func:`alibi_slopes`).

    Returns:
        float32 tensor ``(heads, seq, seq)`` or ``(batch, heads, seq, seq)``: 0 on the
        diagonal, :math:`-m_h (p_i - p_j)` below it, :math:`-\infty` above (computed in
        float64, on ``positions``' device).
    """
    for name, t, dims, rule in (("positions", positions, (1, 2), "a (seq,) or (batch, seq)"),
                                ("slopes", slopes, (1,), "a (heads,)")):
        if not isinstance(t, torch.Tensor) or t.dim() not in dims:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be {rule} tensor, got {got}")
    p = positions.to(torch.float64)
    n = p.shape[-1]
    dist = p[..., :, None] - p[..., None, :]  # (..., seq_q, seq_k): p_i - p_j
    m = slopes.to(device=p.device, dtype=torch.float64).view(-1, 1, 1)
    bias = -m * dist.unsqueeze(-3)  # (..., heads, seq, seq)
    allowed = torch.ones(n, n, dtype=torch.bool, device=p.device).tril()
    return bias.masked_fill(~allowed, float("-inf")).to(torch.float32)


class TransformerBlock(nn.Module):
    """One block: self-attention and a position-wise feed-forward network, each residual.

    ``norm="pre"``: ``x + Dropout(Sublayer(LN(x)))``; ``norm="post"``:
    ``LN(x + Dropout(Sublayer(x)))`` (Vaswani et al. 2017). The feed-forward network is
    ``Linear(d_model, d_ff) -> ReLU -> Linear(d_ff, d_model)`` (eq. 2 of the paper).
    ``forward(x, mask, head_mask, positions)`` returns ``(x, weights)`` with ``weights``
    ``(batch, heads, seq, seq)`` or ``None``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        rope: bool = False,
        rope_base: float = 10000.0,
        rope_layout: str = "interleaved",
        bias: bool = True,
        norm: str = "pre",
        num_kv_heads: Optional[int] = None,
    ) -> None:
        super().__init__()
        if norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        self.norm = norm
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(
            d_model, num_heads, dropout=attn_dropout, bias=bias, rope=rope, rope_base=rope_base, rope_layout=rope_layout,
            num_kv_heads=num_kv_heads,
        )
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff, bias=bias), nn.ReLU(), nn.Linear(d_ff, d_model, bias=bias))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None, head_mask=None, positions=None, need_weights=True, cache=None, layer_idx=0):
        kv = {} if cache is None else {"cache": cache, "layer_idx": layer_idx}  # KV-cache decoding (notebook 07 §6)
        if self.norm == "pre":
            a, w = self.attn(self.ln1(x), mask=mask, head_mask=head_mask, need_weights=need_weights, positions=positions, **kv)
            x = x + self.drop(a)
            x = x + self.drop(self.ff(self.ln2(x)))
        else:
            a, w = self.attn(x, mask=mask, head_mask=head_mask, need_weights=need_weights, positions=positions, **kv)
            x = self.ln1(x + self.drop(a))
            x = self.ln2(x + self.drop(self.ff(x)))
        return x, w


class TinyTransformer(nn.Module):
    r"""A small decoder-only (``causal=True``) or encoder-only transformer over token ids.

    ``tokens -> Embedding (+ position) -> Dropout -> num_layers x TransformerBlock
    -> (final LN for pre-LN) -> Linear(d_model, vocab_size) -> logits``.

    Positional information (``pos``), each in one place:

    * ``"none"``: nothing; a causal model can still infer position from the mask.
    * ``"sinusoidal"``: :func:`sinusoidal_encoding` added to the embeddings (any position; ``_embed``).
    * ``"learned"``: an ``nn.Embedding(max_len, d_model)`` added to the embeddings (``_embed``); positions
      ``>= max_len`` raise a ``ValueError`` naming ``max_len`` (there is no row for them).
    * ``"rope"``: no additive encoding; Q and K are rotated in every layer
      (``MultiHeadAttention(rope=True)``, base ``rope_base``, layout ``rope_layout``).
    * ``"alibi"``: no additive encoding; every layer adds the causal bias :math:`-m_h (i - j)` to head
      :math:`h`'s scores (:func:`alibi_bias`, slopes :func:`alibi_slopes`; Press et al. 2022;
      ``_attention_mask``). Needs ``causal=True``.

    Only ``"learned"`` is limited by ``max_len``; the others evaluate at any length.

    After each forward with ``need_weights=True`` (the default), ``model.attention_weights`` is a
    list (one per layer) of detached ``(batch, heads, seq, seq)`` tensors, for plots and head analysis.

    Args:
        vocab_size: number of token ids.
        d_model: width (even for ``"sinusoidal"``; ``d_model / num_heads`` even for ``"rope"``).
        num_heads: heads per layer, dividing ``d_model``.
        num_layers: number of blocks.
        max_len: the longest sequence the ``"learned"`` table covers (recorded for the
            others, which do not need it).
        pos: ``"none"``, ``"sinusoidal"``, ``"learned"``, ``"rope"`` or ``"alibi"``.
        dropout: residual dropout (on each sublayer output and on the embedding sum),
            sec. 5.4 of the paper (``P_drop = 0.1`` there).
        causal: apply the causal mask (decoder-only language model).
        d_ff: feed-forward width, default ``4 * d_model``.
        attn_dropout: dropout on the attention weights (not in the original paper).
        rope_base, rope_layout: RoPE options (see :class:`MultiHeadAttention`).
        bias: biases in the linear layers.
        norm: ``"pre"`` (default) or ``"post"`` (the original paper).
        num_kv_heads: key/value heads per layer (default ``num_heads``); fewer gives
            grouped-query attention, 1 multi-query attention (see :class:`MultiHeadAttention`;
            notebook 05).
        seed: if given, the parameters are initialised (on the CPU) from the CPU generator
            seeded with ``seed`` inside ``torch.random.fork_rng`` (the global RNG is left
            untouched; only the CPU generator is re-seeded, not ``torch.manual_seed``'s
            CUDA generators, so a caller's CUDA random state is untouched too), so the same
            seed gives the same model whatever ran before.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        max_len: int,
        pos: str = "rope",
        dropout: float = 0.0,
        causal: bool = True,
        d_ff: Optional[int] = None,
        attn_dropout: float = 0.0,
        rope_base: float = 10000.0,
        rope_layout: str = "interleaved",
        bias: bool = True,
        norm: str = "pre",
        seed: Optional[int] = None,
        num_kv_heads: Optional[int] = None,
    ) -> None:
        super().__init__()
        for name, val in (("vocab_size", vocab_size), ("d_model", d_model), ("num_heads", num_heads),
                          ("num_layers", num_layers), ("max_len", max_len)):
            check_int(val, name)
        check_choice(pos, "pos", POSITIONAL_ENCODINGS)
        if pos == "alibi" and not causal:
            raise ValueError("pos='alibi' needs causal=True (Press et al. define ALiBi's bias -m(i-j) for keys j <= i)")
        if pos == "sinusoidal" and d_model % 2 != 0:
            raise ValueError(f"pos='sinusoidal' needs an even d_model, got {d_model}")
        check_fraction(dropout, "dropout")
        d_ff = check_int(4 * d_model if d_ff is None else d_ff, "d_ff")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be None or a non-negative int, got {seed!r}")
        self.vocab_size, self.d_model, self.num_heads, self.num_layers = vocab_size, d_model, num_heads, num_layers
        self.max_len, self.pos, self.causal, self.norm = max_len, pos, bool(causal), norm
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.default_generator.manual_seed(seed)  # the CPU only: init runs on the CPU
            self.tok_emb = nn.Embedding(vocab_size, d_model)
            self.pos_emb = nn.Embedding(max_len, d_model) if pos == "learned" else None
            self.blocks = nn.ModuleList(
                TransformerBlock(d_model, num_heads, d_ff, dropout=dropout, attn_dropout=attn_dropout,
                                 rope=(pos == "rope"), rope_base=rope_base, rope_layout=rope_layout,
                                 bias=bias, norm=norm, num_kv_heads=num_kv_heads)
                for _ in range(num_layers)
            )
            self.ln_f = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()
            self.head = nn.Linear(d_model, vocab_size, bias=bias)
        self.drop = nn.Dropout(dropout)
        self.attention_weights: list[torch.Tensor] = []

    def extra_repr(self) -> str:
        return f"pos={self.pos!r}, causal={self.causal}, norm={self.norm!r}, max_len={self.max_len}"

    def forward(
        self,
        tokens: torch.Tensor,
        head_mask: Optional[torch.Tensor] = None,
        positions: Optional[torch.Tensor] = None,
        offset: Union[int, float] = 0,
        need_weights: bool = True,
        cache=None,
    ) -> torch.Tensor:
        r"""Logits for every position.

        Args:
            tokens: ``(batch, seq)`` integer token ids in ``[0, vocab_size)``.
            head_mask: ``(num_layers, num_heads)`` or ``(batch, num_layers, num_heads)``;
                layer ``l`` multiplies head ``h``'s output by ``head_mask[..., l, h]``
                (0 prunes it). A float tensor with ``requires_grad=True`` yields
                :math:`\partial \mathcal{L} / \partial m_{l,h}`, the head importance of
                Michel et al. (2019).
            positions: ``(seq,)`` or ``(batch, seq)`` positions used by the positional
                encoding; default ``0 .. seq-1``. (The causal mask is always by index.)
            offset: added to the positions: ``offset=5`` evaluates the same tokens as if
                they started at position 5 (shift-invariance experiments of notebook 06).
            need_weights: record ``self.attention_weights`` (else the fused attention path
                runs and the list is emptied).
            cache: a :class:`helpers.kvcache.KVCache` with ``num_layers`` layers (causal models
                only): ``tokens`` are the next tokens after the cached ones, at positions
                ``cache.seq_len() + 0 .. seq-1`` (+ ``offset``) unless ``positions`` says otherwise;
                their keys and values are appended to the cache (notebook 07 §6; :meth:`generate`).

        Returns:
            Logits ``(batch, seq, vocab_size)``.
        """
        pos, head_mask = self._check_inputs(tokens, head_mask, positions, offset, cache)  # pos None: 0 .. seq-1
        x = self._embed(tokens, pos)
        x = self.drop(x)
        mask = self._attention_mask(tokens.shape[1], pos, cache, tokens.device)
        rope_pos = pos if self.pos == "rope" else None  # RoPE acts inside attention, in every layer
        weights = []
        for i, block in enumerate(self.blocks):
            layer_hm = None if head_mask is None else head_mask[..., i, :]  # (heads,) or (batch, heads)
            x, w = block(x, mask=mask, head_mask=layer_hm, positions=rope_pos, need_weights=need_weights,
                         cache=cache, layer_idx=i)
            if need_weights:
                weights.append(w.detach())
        self.attention_weights = weights
        return self.head(self.ln_f(x))

    # ------------------------------------------------------------------ the pieces of forward
    def _embed(self, tokens: torch.Tensor, pos: Optional[torch.Tensor]) -> torch.Tensor:
        """Token embeddings plus the *absolute* encodings (``learned``, ``sinusoidal``); RoPE and ALiBi
        act inside attention instead. ``pos``: the positions, or None for ``0 .. seq-1``."""
        x = self.tok_emb(tokens)  # (batch, seq, d_model)
        if self.pos in ("learned", "sinusoidal"):
            p = torch.arange(tokens.shape[1], device=tokens.device) if pos is None else pos
            if self.pos == "learned":
                x = x + self.pos_emb(p.long())  # row p of the table
            else:
                x = x + sinusoidal_encoding(p, self.d_model).to(device=x.device, dtype=x.dtype)
        return x

    def _attention_mask(self, n: int, pos: Optional[torch.Tensor], cache, device) -> Optional[torch.Tensor]:
        """The mask every block uses: causal (or none for an encoder); with ALiBi the causal mask plus the
        linear distance penalty, an additive bias ``(heads, n, n)`` or ``(batch, heads, n, n)``; None when
        decoding with a cache (the decoding step masks cached + new keys itself)."""
        if cache is not None:
            return None
        if self.pos == "alibi":
            return alibi_bias(torch.arange(n, device=device) if pos is None else pos, alibi_slopes(self.num_heads))
        return causal_mask(n, device=device) if self.causal else None

    # ------------------------------------------------------------------ argument checks, once per call
    def _check_inputs(self, tokens, head_mask, positions, offset, cache):
        """Check forward's arguments; return the positions (None for ``0 .. seq-1``) and the head mask."""
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"tokens must be a torch.Tensor of token ids, got {type(tokens).__name__}")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (batch, seq), got {tuple(tokens.shape)}")
        if tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise TypeError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"tokens must be in [0, vocab_size={self.vocab_size}), got values in "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        if isinstance(offset, bool) or not isinstance(offset, (int, float)):
            raise TypeError(f"offset must be a number, got {type(offset).__name__} ({offset!r})")
        b, n = tokens.shape
        if cache is not None:
            past = self._check_cache(cache)
            if positions is None:  # KV-cache decoding: these tokens follow the cached ones
                offset = offset + past
        if positions is None:
            pos = None if offset == 0 else torch.arange(n, device=tokens.device) + offset
        else:
            pos = torch.as_tensor(positions, device=tokens.device)
            if pos.shape not in ((n,), (b, n)):
                raise ValueError(f"positions must have shape (seq,) = ({n},) or (batch, seq) = ({b}, {n}), "
                                 f"got {tuple(pos.shape)}")
            pos = pos + offset
        if self.pos == "learned":  # a table lookup: integer positions 0 .. max_len-1
            p = torch.arange(n, device=tokens.device) if pos is None else pos
            if p.is_floating_point() and not bool((p == p.round()).all()):
                raise ValueError("pos='learned' needs integer positions (a table lookup), got fractional positions")
            if p.numel() and (int(p.min()) < 0 or int(p.max()) >= self.max_len):
                raise ValueError(
                    f"pos='learned' has a table for positions 0 .. max_len-1 = {self.max_len - 1} "
                    f"(max_len={self.max_len}); got positions in [{int(p.min())}, {int(p.max())}] (seq={n}). "
                    f"Use pos='sinusoidal', 'rope' or 'none' to evaluate beyond max_len."
                )
        if head_mask is not None:
            L, H = self.num_layers, self.num_heads
            if not isinstance(head_mask, torch.Tensor):
                head_mask = torch.as_tensor(head_mask, dtype=torch.float32)
            if head_mask.shape != (L, H) and not (head_mask.dim() == 3 and head_mask.shape[1:] == (L, H)
                                                  and head_mask.shape[0] in (1, b)):
                raise ValueError(f"head_mask must have shape (num_layers, num_heads) = ({L}, {H}) or "
                                 f"(batch, num_layers, num_heads) = ({b}, {L}, {H}), got {tuple(head_mask.shape)}")
        return pos, head_mask

    def _check_cache(self, cache) -> int:
        """Check a KV cache for this model; return how many tokens it holds."""
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a helpers.kvcache.KVCache, got {type(cache).__name__}")
        if not self.causal:
            raise ValueError("cache needs causal=True: a KV cache is for left-to-right decoding")
        if self.pos == "alibi":
            raise ValueError("cache is not supported with pos='alibi' (its bias would need the cached positions)")
        if cache.num_layers != self.num_layers:
            raise ValueError(f"cache must have num_layers={self.num_layers} layers, got {cache.num_layers}")
        return cache.seq_len(0)

    # ------------------------------------------------------------------ decoding (notebook 07 §6)
    def generate(self, tokens: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
                 return_logits: bool = False):
        r"""Greedy decoding (:func:`helpers.kvcache.greedy_generate`): ``max_new_tokens`` times,
        append the arg-max of the last position's logits.

        ``use_cache=True`` fills a :class:`~helpers.kvcache.KVCache` with the prompt, then feeds
        one token per step; ``use_cache=False`` reruns the whole sequence each step. Same tokens.

        Args:
            tokens: ``(batch, prompt_len)`` token ids, prompt_len >= 1.
            max_new_tokens: int >= 0; ``prompt_len + max_new_tokens`` must not exceed ``max_len``
                (the length the model was built for). The cache is not sized by it: it is a
                ``KVCache(num_layers)`` with ``max_len=None``, growing by one token per step.
            use_cache: decode with the KV cache.
            return_logits: also return the ``(batch, max_new_tokens, vocab_size)`` logits.

        Returns:
            ``(batch, prompt_len + max_new_tokens)`` token ids (and the logits).
        """
        if not self.causal:
            raise ValueError("generate needs causal=True (a decoder-only model)")
        check_int(max_new_tokens, "max_new_tokens", 0)  # TypeError for a bool or a float, as greedy_generate
        if isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(
                f"prompt length + max_new_tokens must be <= max_len={self.max_len}, got "
                f"{tokens.shape[1]} + {max_new_tokens} = {tokens.shape[1] + max_new_tokens}"
            )
        was_training = self.training
        self.eval()
        try:
            return greedy_generate(self, tokens, max_new_tokens, use_cache=use_cache, return_logits=return_logits)
        finally:
            self.train(was_training)
