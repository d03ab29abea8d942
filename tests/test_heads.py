"""Tests of helpers.heads: head importance, pruning curves, similarity, roles (notebook 05)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import settings

from helpers import heads as hd
from helpers.model import TinyTransformer
from helpers.tasks import IGNORE_INDEX, LookbackTask

SETTINGS = settings(max_examples=20, deadline=None)
L, H = 2, 4


@pytest.fixture(scope="module")
def model():
    return TinyTransformer(10, 16, H, L, 12, pos="rope", seed=0).eval()


@pytest.fixture(scope="module")
def data():
    return LookbackTask(num_symbols=10, seq_len=12, k=2).make(24, seed=1)


def _loss(model, x, y, mask=None):
    logits = model(x, head_mask=mask)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)


# ---------------------------------------------------------------- importance
def test_head_importance_shape_finite_and_equal_to_per_example_autograd(model, data):
    x, y = data
    imp = hd.head_importance(model, data)
    assert imp.shape == (L, H) and torch.isfinite(imp).all() and (imp >= 0).all() and (imp > 0).any()
    # reference: |dL(x)/dxi| example by example with a plain (num_layers, num_heads) mask, then averaged
    ref = torch.zeros(L, H)
    for i in range(len(x)):
        xi = torch.ones(L, H, requires_grad=True)
        (g,) = torch.autograd.grad(_loss(model, x[i : i + 1], y[i : i + 1], xi), xi)
        ref += g.abs()
    torch.testing.assert_close(imp, ref / len(x), atol=1e-6, rtol=1e-4)
    # two batches = the same examples in one batch
    torch.testing.assert_close(hd.head_importance(model, [(x[:10], y[:10]), (x[10:], y[10:])]), imp, atol=1e-6, rtol=1e-4)
    assert all(p.grad is None for p in model.parameters())


def test_head_importance_normalize_and_given_mask(model, data):
    norm = hd.head_importance(model, data, normalize=True)
    torch.testing.assert_close(norm.norm(dim=1), torch.ones(L))
    mask = torch.ones(L, H)
    mask[0, 1] = 0
    imp = hd.head_importance(model, data, head_mask=mask)
    assert not torch.allclose(imp, hd.head_importance(model, data))


def test_head_importance_under_no_grad_and_with_inference_tensors(model, data):
    # it turns gradients back on itself: torch.no_grad() around the call changes nothing
    imp = hd.head_importance(model, data)
    with torch.no_grad():
        torch.testing.assert_close(hd.head_importance(model, data), imp, atol=0, rtol=0)
        torch.testing.assert_close(hd.pruning_curve(model, data, "importance", recompute=True).accuracy,
                                   hd.pruning_curve(model, data, "importance", recompute=True).accuracy)
    with torch.inference_mode():  # data made under inference mode, used outside it
        x_inf, y_inf = (t.clone() for t in data)
    torch.testing.assert_close(hd.head_importance(model, (x_inf, y_inf)), imp, atol=0, rtol=0)


def test_head_importance_refuses_inference_mode(model, data):
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match=r"head_importance .* needs autograd, which torch\.inference_mode\(\) "
                                               r"turns off: call it outside that block \(under torch\.no_grad\(\) it works\)"):
            hd.head_importance(model, data)


def test_head_importance_in_the_models_dtype(model, data):
    x, y = data
    m64 = TinyTransformer(10, 16, H, L, 12, pos="rope", seed=0).double().eval()
    imp64 = hd.head_importance(m64, data, normalize=True)
    assert imp64.dtype == torch.float64
    ref = torch.zeros(L, H, dtype=torch.float64)
    for i in range(len(x)):
        xi = torch.ones(L, H, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(_loss(m64, x[i : i + 1], y[i : i + 1], xi), xi)
        ref += g.abs()
    ref = ref / len(x)
    torch.testing.assert_close(imp64, ref / ref.norm(dim=1, keepdim=True), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(hd.head_importance(m64, data).float(), hd.head_importance(model, data), atol=1e-6, rtol=1e-4)
    m16 = TinyTransformer(10, 16, H, L, 12, pos="rope", seed=0).to(torch.bfloat16).eval()
    assert hd.head_importance(m16, data).dtype == torch.float32    # accumulated in float32 at least


def test_first_order_taylor_predicts_the_loss_change(model, data):
    """Scaling one head by (1 - eps) changes the loss by about -eps * dL/dxi (Michel et al. sec. 4.1)."""
    x, y = data
    xi = torch.ones(L, H, requires_grad=True)
    (grad,) = torch.autograd.grad(_loss(model, x, y, xi), xi)
    eps = 1e-3
    with torch.no_grad():
        m = torch.ones(L, H)
        m[1, 2] -= eps
        change = _loss(model, x, y, m) - _loss(model, x, y)
    assert math.isclose(float(change), -eps * float(grad[1, 2]), rel_tol=0.05, abs_tol=1e-7)


def test_masking_a_head_equals_removing_its_slice(model, data):
    """head_mask = 0 for head h == the attention output with h's slice of W^O removed."""
    x, _ = data
    l, h = 1, 2
    block = model.blocks[l]
    outs = hd.head_outputs(model, x)  # (L, H, b, n, d)
    assert outs.shape == (L, H, len(x), 12, 16)
    captured = {}
    hook = block.attn.register_forward_hook(lambda mod, inp, out: captured.update(o=out[0]))  # returns None
    mask = torch.ones(L, H)
    mask[l, h] = 0.0
    with torch.no_grad():
        model(x, head_mask=mask)
    hook.remove()
    expected = outs[l].sum(0) - outs[l, h] + block.attn.linear_out.bias
    # the layer-l input is unchanged by a mask on layer l, so only head h's term goes
    torch.testing.assert_close(captured["o"], expected, atol=1e-5, rtol=1e-5)


def test_ablation_importance_matches_direct_evaluation(model, data):
    from helpers.train import evaluate

    acc_drop = hd.ablation_importance(model, data)
    loss_rise = hd.ablation_importance(model, data, metric="loss")
    assert acc_drop.shape == loss_rise.shape == (L, H)
    base_loss, base_acc = evaluate(model, data, head_mask=torch.ones(L, H))
    m = torch.ones(L, H)
    m[0, 3] = 0
    loss, acc = evaluate(model, data, head_mask=m)
    assert math.isclose(float(acc_drop[0, 3]), base_acc - acc, abs_tol=1e-6)
    assert math.isclose(float(loss_rise[0, 3]), loss - base_loss, rel_tol=1e-4, abs_tol=1e-6)


# ------------------------------------------------------------------ pruning
@pytest.mark.parametrize("order,kw", [("importance", {}), ("importance", {"recompute": False}),
                                      ("random", {"seed": 3}), ("random", {"heads_per_step": 3})])
def test_pruning_curve_bookkeeping(model, data, order, kw):
    c = hd.pruning_curve(model, data, order, **kw)
    N, step = L * H, kw.get("heads_per_step", 1)
    k = math.ceil(N / step)
    assert len(c.fractions) == len(c.accuracy) == len(c.loss) == len(c.masks) == k + 1
    assert sorted(c.order) == [(l, h) for l in range(L) for h in range(H)]  # each head once
    expected = [min(i * step, N) / N for i in range(k + 1)]
    torch.testing.assert_close(c.fractions, torch.tensor(expected))
    kept = c.masks.sum((1, 2))
    assert kept[0] == N and kept[-1] == 0 and bool((kept[1:] <= kept[:-1]).all())  # monotone
    assert bool(((c.masks[1:] <= c.masks[:-1])).all())  # a pruned head never comes back
    for i in range(k + 1):  # masks agree with the order
        removed = set(c.order[: min(i * step, N)])
        assert {(l, h) for l in range(L) for h in range(H) if c.masks[i, l, h] == 0} == removed
    from helpers.train import evaluate

    assert math.isclose(float(c.accuracy[0]), evaluate(model, data, head_mask=torch.ones(L, H))[1], abs_tol=1e-9)


def test_pruning_curve_orders(model, data):
    imp = hd.head_importance(model, data)
    fixed = hd.pruning_curve(model, data, "importance", recompute=False)
    assert fixed.order[0] == divmod(int(imp.argmin()), H)
    rec = hd.pruning_curve(model, data, "importance")
    assert rec.order[0] == fixed.order[0]  # same first choice; later ones may differ
    scores = torch.arange(L * H, dtype=torch.float32).flip(0).view(L, H)
    assert hd.pruning_curve(model, data, scores).order == [divmod(i, H) for i in range(L * H)][::-1]
    given_order = [(1, 3), (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3)]
    assert hd.pruning_curve(model, data, given_order).order == given_order
    r1, r2 = hd.pruning_curve(model, data, "random", seed=5), hd.pruning_curve(model, data, "random", seed=5)
    assert r1.order == r2.order and torch.equal(r1.accuracy, r2.accuracy)


def test_max_prunable():
    acc = torch.tensor([0.9, 0.9, 0.895, 0.85, 0.9, 0.1], dtype=torch.float64)
    c = hd.PruningCurve(torch.linspace(0, 1, 6), acc, acc, [], torch.ones(6, 1, 5))
    assert c.max_prunable(0.01) == pytest.approx(0.4)  # stops at the first drop, even if it recovers
    assert c.max_prunable(0.06) == pytest.approx(0.8)
    assert c.max_prunable(0.0) == pytest.approx(0.2)


# --------------------------------------------------------------- similarity
@pytest.mark.parametrize("kind", ["attention", "output"])
def test_head_similarity_symmetric_unit_diagonal(model, data, kind):
    s = hd.head_similarity(model, data, kind)
    assert s.shape == (L * H, L * H)
    torch.testing.assert_close(s, s.T)
    torch.testing.assert_close(torch.diagonal(s), torch.ones(L * H))
    lo = 0.0 if kind == "attention" else -1.0
    assert bool((s >= lo - 1e-6).all() and (s <= 1 + 1e-6).all())


def test_js_similarity_against_a_direct_formula(model, data):
    x, _ = data
    w = hd.attention_maps(model, x).double()  # (L, b, H, n, n)
    assert w.shape == (L, len(x), H, 12, 12)
    p, q = w[0, :, 1], w[1, :, 3]  # heads (0, 1) and (1, 3)
    m = (p + q) / 2
    kl = lambda a, b: (a * (a / b).log()).nan_to_num(0.0).sum(-1)  # noqa: E731
    js = (0.5 * kl(p, m) + 0.5 * kl(q, m)).mean()
    s = hd.head_similarity(model, data)
    assert math.isclose(float(s[1, H + 3]), 1 - float(js) / math.log(2), abs_tol=1e-5)


def test_identical_heads_are_similar_and_clustered():
    model = TinyTransformer(10, 16, 2, 1, 12, pos="rope", seed=0).eval()
    attn = model.blocks[0].attn
    with torch.no_grad():  # make head 1 a copy of head 0 (same Q, K, V rows and W^O columns)
        for lin in (attn.linear_q, attn.linear_k, attn.linear_v):
            lin.weight[8:] = lin.weight[:8]
            lin.bias[8:] = lin.bias[:8]
        attn.linear_out.weight[:, 8:] = attn.linear_out.weight[:, :8]
    x = torch.randint(0, 10, (4, 12), generator=torch.Generator().manual_seed(0))
    for kind in ("attention", "output"):
        s = hd.head_similarity(model, (x, x), kind)
        assert math.isclose(float(s[0, 1]), 1.0, abs_tol=1e-5)
    assert hd.similarity_clusters(s, 0.99) == [[0, 1]]


def test_similarity_clusters_single_linkage():
    s = torch.eye(5)
    s[0, 2] = s[2, 0] = 0.9
    s[2, 4] = s[4, 2] = 0.95
    s[1, 3] = s[3, 1] = 0.5
    assert hd.similarity_clusters(s, 0.8) == [[0, 2, 4], [1], [3]]
    assert hd.similarity_clusters(s, 0.4) == [[0, 2, 4], [1, 3]]


# ------------------------------------------------------------------- roles
def test_attention_at_offset_and_induction_on_planted_maps():
    n, b = 6, 2
    prev = torch.zeros(n, n)
    prev[0, 0] = 1
    prev[torch.arange(1, n), torch.arange(0, n - 1)] = 1  # attends to t - 1
    selfm = torch.eye(n)
    x = torch.tensor([[3, 4, 5, 3, 7, 4], [1, 2, 1, 2, 1, 2]])
    # induction map: from t to s+1 where x_s == x_t, s < t (uniform over such s); else to t
    ind = torch.zeros(b, n, n)
    for i in range(b):
        for t in range(n):
            tg = [s + 1 for s in range(t) if x[i, s] == x[i, t]]
            for s in tg or [t]:
                ind[i, t, s] = 1 / len(tg or [t])
    w = torch.stack([prev.expand(b, n, n), selfm.expand(b, n, n), ind], dim=1)[None]  # (1, b, 3, n, n)
    off1 = hd.attention_at_offset(w, 1)
    torch.testing.assert_close(off1[0, :2], torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(hd.attention_at_offset(w, 0)[0, :2], torch.tensor([1 / 6, 1.0]))  # row 0 of prev is itself
    induct = hd.induction_score(w, x)
    assert math.isclose(float(induct[0, 2]), 1.0, abs_tol=1e-6) and float(induct[0, 1]) == 0.0
    qm = torch.zeros(b, n, dtype=torch.bool)
    qm[1, 5] = True  # only the last query of row 1 (x=2, earlier 2s at 1, 3 -> keys 2, 4)
    # in the periodic row 1 2 1 2 1 2, the previous token (key 4) *is* an induction target: both score 1
    torch.testing.assert_close(hd.induction_score(w, x, qm)[0], torch.tensor([1.0, 0.0, 1.0]))
    labels = hd.label_heads({"prev": off1, "self": hd.attention_at_offset(w, 0), "induction": induct}, 0.9)
    assert labels == [["prev", "self", "induction"]]


def test_label_heads_multiple_roles_and_none():
    labels = hd.label_heads({"a": torch.tensor([[0.9, 0.1]]), "b": torch.tensor([[0.95, 0.2]])}, 0.5)
    assert labels == [["b+a", "-"]]


def test_attention_entropy():
    w = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    torch.testing.assert_close(hd.attention_entropy(w), torch.tensor(math.log(2) / 2))
    u = torch.full((3, 4, 4), 0.25)
    torch.testing.assert_close(hd.attention_entropy(u), torch.full((3,), math.log(4)))


# ------------------------------------------------------------------- errors
def test_errors(model, data):
    x, y = data
    with pytest.raises(TypeError, match=r"model must be a helpers.model.TinyTransformer .* got Linear"):
        hd.head_importance(torch.nn.Linear(2, 2), data)
    with pytest.raises(TypeError, match=r"batches must be an \(inputs, targets\) pair of tensors or a non-empty list"):
        hd.head_importance(model, [])
    with pytest.raises(TypeError, match=r"batches\[1\] must be an \(inputs, targets\) pair of tensors, got Tensor"):
        hd.head_importance(model, [data, x])
    with pytest.raises(ValueError, match=r"batches\[0\]: inputs and targets must both have shape \(batch, seq\), got \(24, 12\) and \(24, 11\)"):
        hd.head_importance(model, (x, y[:, :-1]))
    with pytest.raises(ValueError, match=r"batches contain no scored position"):
        hd.head_importance(model, (x, torch.full_like(y, IGNORE_INDEX)))
    with pytest.raises(ValueError, match=r"head_mask must have shape \(num_layers, num_heads\) = \(2, 4\), got \(4,\)"):
        hd.head_importance(model, data, head_mask=torch.ones(4))
    with pytest.raises(ValueError, match=r"metric must be 'accuracy' or 'loss', got 'f1'"):
        hd.ablation_importance(model, data, metric="f1")
    with pytest.raises(ValueError, match=r"order must be 'importance', 'random', .* got 'magnitude'"):
        hd.pruning_curve(model, data, "magnitude")
    with pytest.raises(ValueError, match=r"order\[0\] \(2, 0\) is out of range: layer must be in \[0, 2\)"):
        hd.pruning_curve(model, data, [(2, 0)])
    with pytest.raises(TypeError, match=r"order\[0\] must be a \(layer, head\) pair of ints, got 'a'"):
        hd.pruning_curve(model, data, ["a"])
    with pytest.raises(ValueError, match=r"order must list every one of the 8 \(layer, head\) pairs exactly once, got 2 entries with 1 distinct"):
        hd.pruning_curve(model, data, [(0, 0), (0, 0)])
    with pytest.raises(ValueError, match=r"heads_per_step must be >= 1, got 0"):
        hd.pruning_curve(model, data, heads_per_step=0)
    with pytest.raises(ValueError, match=r"kind must be 'attention' or 'output', got 'cosine'"):
        hd.head_similarity(model, data, kind="cosine")
    with pytest.raises(ValueError, match=r"similarity must be a square \(N, N\) tensor, got \(2, 3\)"):
        hd.similarity_clusters(torch.ones(2, 3), 0.5)
    with pytest.raises(ValueError, match=r"weights must be attention maps of shape \(num_layers, batch, num_heads, seq, seq\)"):
        hd.attention_at_offset(torch.ones(2, 3, 3), 1)
    w = hd.attention_maps(model, x)
    with pytest.raises(ValueError, match=r"offset must be an int in \[0, seq=12\), got 12"):
        hd.attention_at_offset(w, 12)
    with pytest.raises(ValueError, match=r"query_mask must be a bool tensor of shape \(batch, seq\) = \(24, 12\), got \(24, 11\)"):
        hd.attention_at_offset(w, 1, torch.ones(24, 11, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"inputs must have shape \(batch, seq\) = \(24, 12\), got \(2, 12\)"):
        hd.induction_score(w, x[:2])
    with pytest.raises(ValueError, match=r"inputs must be a \(batch, seq\) tensor of token ids, got \(12,\)"):
        hd.attention_maps(model, x[0])
    with pytest.raises(ValueError, match=r"scores must all have the same shape \(num_layers, num_heads\)"):
        hd.label_heads({"a": torch.ones(2, 4), "b": torch.ones(4)})
    with pytest.raises(ValueError, match=r"scores must be a non-empty dict"):
        hd.label_heads({})
    with pytest.raises(ValueError, match=r"weights must be a tensor \(\.\.\., seq_q, seq_k\), got \(3,\)"):
        hd.attention_entropy(torch.ones(3))


# ------------------------------------------------------- held-out pruning, GQA conversion
def test_pruning_curve_importance_on_other_data_metrics_on_given_data(model, data):
    x, y = data
    imp_data = LookbackTask(num_symbols=10, seq_len=12, k=2).make(24, seed=7)
    c = hd.pruning_curve(model, data, "importance", recompute=False, importance_batches=imp_data)
    # the order is that of the importance on imp_data, not on data
    expected = torch.argsort(hd.head_importance(model, imp_data).flatten(), stable=True).tolist()
    assert c.order == [(i // H, i % H) for i in expected]
    # the metrics are those of data with the recorded masks
    for k in (0, 3, L * H):
        loss, acc = hd._evaluate(model, [(x, y)], c.masks[k])
        assert c.accuracy[k].item() == pytest.approx(acc) and c.loss[k].item() == pytest.approx(loss)
    # recomputed: the first head pruned is the least important one on imp_data
    r = hd.pruning_curve(model, data, "importance", recompute=True, importance_batches=imp_data)
    assert r.order[0] == c.order[0]
    # ... and each later step is the least important remaining head given the mask, on imp_data
    imp2 = hd.head_importance(model, imp_data, head_mask=r.masks[1]).masked_fill(r.masks[1] == 0, float("inf"))
    assert r.order[1] == divmod(int(imp2.flatten().argmin()), H)


def test_mean_pool_kv_heads_matches_the_grouped_model_and_the_mean_of_head_blocks(model):
    x = torch.randint(0, 10, (3, 12), generator=torch.Generator().manual_seed(0))
    same = hd.mean_pool_kv_heads(model, H)                       # groups of one: nothing changes
    torch.testing.assert_close(same(x), model(x))
    pooled = hd.mean_pool_kv_heads(model, 2)
    ref = TinyTransformer(10, 16, H, L, 12, pos="rope", seed=0, num_kv_heads=2)
    assert {k: v.shape for k, v in pooled.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    assert pooled.num_kv_heads == 2 and all(b.attn.num_kv_heads == 2 for b in pooled.blocks)
    assert model.num_kv_heads == H and all(b.attn.num_kv_heads == H for b in model.blocks)   # input untouched
    hd_ = 16 // H
    for lyr in range(L):
        for name in ("linear_k", "linear_v"):
            w = getattr(model.blocks[lyr].attn, name).weight
            b = getattr(model.blocks[lyr].attn, name).bias
            pw = getattr(pooled.blocks[lyr].attn, name).weight
            pb = getattr(pooled.blocks[lyr].attn, name).bias
            for grp in range(2):
                heads = [w[j * hd_ : (j + 1) * hd_] for j in (2 * grp, 2 * grp + 1)]
                torch.testing.assert_close(pw[grp * hd_ : (grp + 1) * hd_], (heads[0] + heads[1]) / 2)
                biases = [b[j * hd_ : (j + 1) * hd_] for j in (2 * grp, 2 * grp + 1)]
                torch.testing.assert_close(pb[grp * hd_ : (grp + 1) * hd_], (biases[0] + biases[1]) / 2)
    # a loaded grouped model with the pooled weights computes the same function
    ref.load_state_dict(pooled.state_dict())
    torch.testing.assert_close(ref.eval()(x), pooled(x))


def test_mean_pool_kv_heads_is_exact_when_the_heads_of_a_group_share_keys_and_values(model):
    dup = TinyTransformer(10, 16, H, L, 12, pos="rope", seed=3).eval()
    hd_ = 16 // H
    with torch.no_grad():
        for blk in dup.blocks:
            for name in ("linear_k", "linear_v"):
                lin = getattr(blk.attn, name)
                lin.weight.view(1, H, hd_, 16)[:] = lin.weight.view(H, hd_, 16)[0]   # every head = head 0
                lin.bias.view(H, hd_)[:] = lin.bias.view(H, hd_)[0]
    x = torch.randint(0, 10, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(hd.mean_pool_kv_heads(dup, 1)(x), dup(x), atol=1e-5, rtol=1e-5)


def test_mean_pool_kv_heads_errors(model):
    with pytest.raises(ValueError, match=r"num_kv_heads must divide num_heads = 4, got 3"):
        hd.mean_pool_kv_heads(model, 3)
    with pytest.raises(ValueError, match=r"num_kv_heads must be >= 1, got 0"):
        hd.mean_pool_kv_heads(model, 0)
    with pytest.raises(TypeError, match=r"num_kv_heads must be an int, got float"):
        hd.mean_pool_kv_heads(model, 2.0)
    with pytest.raises(ValueError, match=r"model must be multi-head \(num_kv_heads == num_heads = 4\), got num_kv_heads=2"):
        hd.mean_pool_kv_heads(hd.mean_pool_kv_heads(model, 2), 1)
