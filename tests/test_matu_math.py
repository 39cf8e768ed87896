"""Hand-computed checks of MaTU's math (`methods/manytask/matu_math.py`, `matu_aggregate.py`; spec `specs/matu.md`)."""

import pytest
import torch

from manytask.methods.manytask.matu_aggregate import aggregate
from manytask.methods.manytask.matu_math import (
    CROSS_TASK_MODES,
    DEFAULT_KAPPA,
    agreement,
    agreement_mask,
    combine,
    cross_task_term,
    neighbours,
    reconstruct,
    same_task_aggregate,
    size_weights,
    task_similarity,
    unify,
)


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def b(*values):
    return torch.tensor(values, dtype=torch.bool)


def close(actual, expected):
    expected = torch.as_tensor(expected, dtype=torch.float32)
    assert actual.dtype == torch.float32
    assert actual.shape == expected.shape
    assert torch.allclose(actual, expected, atol=1e-6), (actual, expected)


def upload(unified, masks, rescalers=None, sizes=None):
    rescalers = rescalers if rescalers is not None else dict.fromkeys(masks, 1.0)
    sizes = sizes if sizes is not None else dict.fromkeys(masks, 5)
    return {"unified": unified, "masks": masks, "rescalers": rescalers, "sizes": sizes}


# ---------------------------------------------------------------------------------------------------------------- unify


def test_unify_three_vectors_hand_computed():
    tau = torch.stack(
        [
            t(1.0, -2.0, 0.5, 0.0, 3.0, -1.0),
            t(2.0, 1.0, -0.5, 0.0, -1.0, 1.0),
            t(-0.5, 1.0, -1.0, 2.0, -1.0, 0.5),
        ]
    )
    before = tau.clone()
    unified, masks, lam = unify(tau)
    # column sums: [2.5, 0 (exact tie), -1, 2, 1, 0.5] -> sigma = [+, 0, -, +, +, +]
    # mu = max |tau| among agreeing signs: j0 max(1,2)=2; j1 tie -> 0; j2 max(0.5,1)=1; j3 2; j4 3; j5 max(1,0.5)=1
    close(unified, [2.0, 0.0, -1.0, 2.0, 3.0, 1.0])
    # m^t = tau^t * uni > 0; column 1 (the tie) is masked out for everyone although tau^2, tau^3 are positive there;
    # column 3 holds zeros in tau^1, tau^2 -> 0 in their masks.
    assert masks.dtype == torch.bool
    assert masks.tolist() == [
        [True, False, False, False, True, False],
        [True, False, True, False, False, True],
        [False, False, True, True, False, True],
    ]
    # lambda^1 = (1+2+0.5+0+3+1)/(2+3) = 7.5/5; lambda^2 = 5.5/(2+1+1); lambda^3 = 6/(1+2+1)
    close(lam, [1.5, 1.375, 1.5])
    assert torch.equal(tau, before)


def test_unify_empty_mask_and_zero_vector_get_rescaler_one():
    tau = torch.stack([t(1.0, 1.0, 0.0, 0.0), t(-2.0, -2.0, 0.0, 0.0), t(0.0, 0.0, 0.0, 0.0)])
    unified, masks, lam = unify(tau)
    # sums [-1, -1, 0, 0] -> sigma [-, -, 0, 0]; mu = [2, 2, 0, 0] from tau^2
    close(unified, [-2.0, -2.0, 0.0, 0.0])
    assert masks.tolist() == [[False] * 4, [True, True, False, False], [False] * 4]
    # tau^1: 2/0 -> 1 (empty mask; reconstruction is 0 whatever lambda is); tau^2: 4/4 = 1; tau^3: 0/0 -> 1
    close(lam, [1.0, 1.0, 1.0])
    assert torch.isfinite(lam).all()
    close(reconstruct(unified, masks[0], lam[0]), [0.0] * 4)


def test_unify_all_ties():
    tau = torch.stack([t(1.0, -3.0, 0.0, 2.0), t(-1.0, 3.0, 0.0, -2.0)])
    unified, masks, lam = unify(tau)
    close(unified, [0.0] * 4)
    assert not masks.any()
    close(lam, [1.0, 1.0])  # x/0 -> 1 for both


def test_unify_single_vector():
    tau = t(0.5, 0.0, -3.0, 2.0, 0.0)
    unified, masks, lam = unify(tau.unsqueeze(0))
    close(unified, tau)
    assert masks.tolist() == [[True, False, True, True, False]]
    close(lam, [1.0])
    unified, masks, lam = unify(torch.zeros(1, 4))
    close(unified, [0.0] * 4)
    assert not masks.any()
    close(lam, [1.0])


def test_unify_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\[T, d\]"):
        unify(t(1.0, 2.0))
    with pytest.raises(ValueError, match="at least one"):
        unify(torch.zeros(0, 3))


def test_reconstruct_hand_computed_and_batched():
    unified = t(2.0, 0.0, -1.0, 2.0, 3.0, 1.0)
    mask = b(True, False, True, False, False, True)
    # 1.375 * [2, 0, -1, 0, 0, 1]; L1 = 1.375 * 4 = 5.5 = |tau^2|_1 from the three-vector example
    close(reconstruct(unified, mask, 1.375), [2.75, 0.0, -1.375, 0.0, 0.0, 1.375])
    close(reconstruct(unified, mask, torch.tensor(1.375)), [2.75, 0.0, -1.375, 0.0, 0.0, 1.375])
    masks = torch.stack([mask, ~mask])
    out = reconstruct(unified, masks, t(1.375, 2.0))
    close(out[0], reconstruct(unified, mask, 1.375))
    close(out[1], [0.0, 0.0, 0.0, 4.0, 6.0, 0.0])  # 2 * [0,0,0,2,3,0]
    with pytest.raises(ValueError):
        reconstruct(unified, b(True, False), 1.0)


def test_reconstruct_of_unify_keeps_sign_and_l1_norm():
    gen = torch.Generator().manual_seed(0)
    tau = torch.randn(4, 8, generator=gen)
    tau[torch.rand(4, 8, generator=gen) < 0.25] = 0.0  # sprinkle zeros
    before = tau.clone()
    unified, masks, lam = unify(tau)
    rec = reconstruct(unified, masks, lam)
    for i in range(4):
        one = reconstruct(unified, masks[i], lam[i])
        close(rec[i], one)
        on = masks[i]
        assert (one[~on] == 0).all()
        if on.any():
            assert torch.equal(torch.sign(one[on]), torch.sign(tau[i][on]))
            assert one.abs().sum().item() == pytest.approx(tau[i].abs().sum().item(), rel=1e-6)
    assert masks.any(dim=1).all()  # the invariant above was exercised for every row
    assert torch.equal(tau, before)


# ----------------------------------------------------------------------------------------------------------- similarity


def test_task_similarity_hand_vectors():
    a = t(1.0, 2.0, -1.0, 3.0)
    vectors = torch.stack([a, a.clone(), -a, t(1.0, 2.0, 1.0, -3.0), t(1.0, 0.0, 0.0, 1.0)])
    s = task_similarity(vectors)
    assert s.dtype == torch.float32 and s.shape == (5, 5)
    assert torch.equal(s, s.T)
    assert s[0, 1].item() == 1.0  # identical, no zeros
    assert s[0, 0].item() == 1.0
    assert s[0, 2].item() == 0.0  # opposite
    assert s[0, 3].item() == 0.5  # agree on 2 of 4, conflict on 2: 1/2 (0/4 + 1)
    assert s[4, 4].item() == 0.75  # diagonal with zeros: 1/2 (2/4 + 1) < 1
    assert s[0, 4].item() == 0.75  # 2 agreements, 2 zeros
    assert (s >= 0).all() and (s <= 1).all()


# ---------------------------------------------------------------------------------------------------- server: pieces


def test_agreement_mask_threshold_keeps_fractions_below_rho():
    masked = torch.stack([t(1.0, 2.0, 3.0, 1.0, -1.0), t(2.0, 1.0, 0.0, -1.0, -2.0), t(0.5, -1.0, 0.0, 0.0, 0.0)])
    # signs per column: (+,+,+) (+,+,-) (+,0,0) (+,-,0) (-,-,0) -> alpha = 1, 1/3, 1/3, 0, 2/3
    assert torch.allclose(agreement(masked), torch.tensor([1.0, 1 / 3, 1 / 3, 0.0, 2 / 3], dtype=torch.float64))
    m_hat = agreement_mask(masked, rho=0.4)
    assert torch.allclose(m_hat, torch.tensor([1.0, 1 / 3, 1 / 3, 0.0, 1.0], dtype=torch.float64))
    assert torch.equal(agreement_mask(masked, rho=0.3), torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    # alpha exactly rho: 5 holders, votes (+,+,+,-,0) -> |2/5| = 0.4 >= 0.4 -> 1
    five = t(1.0, 1.0, 1.0, -1.0, 0.0).unsqueeze(1)
    assert agreement_mask(five, rho=0.4).tolist() == [1.0]
    assert agreement_mask(five, rho=0.41).tolist() == [pytest.approx(0.4)]


def test_size_weights():
    assert size_weights([10, 30]).tolist() == [0.25, 0.75]
    assert size_weights([0, 0]).tolist() == [0.5, 0.5]  # all-zero sizes: equal weights
    with pytest.raises(ValueError):
        size_weights([3, -1])


def test_neighbours_threshold_kappa_and_tie_break():
    s = torch.tensor(
        [
            [1.0, 0.7, 0.7, 0.9],
            [0.7, 1.0, 0.5, 0.2],
            [0.7, 0.5, 1.0, 0.6],
            [0.9, 0.2, 0.6, 1.0],
        ]
    )
    # row 0: 0.9 (3) first, then the 0.7 tie broken by index (1 before 2); the diagonal is never a neighbour
    assert neighbours(s, eps=0.5, kappa=2) == [[3, 1], [0], [0, 3], [0, 2]]
    assert neighbours(s, eps=0.5, kappa=None)[0] == [3, 1, 2]
    assert neighbours(s, eps=0.5, kappa=0) == [[], [], [], []]
    # S must be strictly above eps: row 1's 0.5 entry is out, 0.7 == eps is out too
    assert neighbours(s, eps=0.7, kappa=5) == [[3], [], [], [0]]
    with pytest.raises(ValueError):
        neighbours(s, kappa=-1)


def test_cross_task_term_uses_mask_of_receiving_task():
    m_hat = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    others = torch.tensor([[2.0, 2.0, 2.0], [-4.0, 4.0, 4.0]], dtype=torch.float64)
    # 0.5*[1,0.5,0]*[2,2,2] + 0.25*[1,0.5,0]*[-4,4,4] = [1, 0.5, 0] + [-1, 0.5, 0]
    assert cross_task_term(m_hat, others, [0.5, 0.25]).tolist() == [0.0, 1.0, 0.0]
    assert cross_task_term(m_hat, others[:0], []).tolist() == [0.0, 0.0, 0.0]


def test_same_task_aggregate_and_combine_pieces():
    masked = torch.stack([t(1.0, 2.0), t(3.0, 0.0)])
    m_hat = agreement_mask(masked)  # [1, 1/2 >= 0.4 -> 1]
    # gamma = [1/4, 3/4], lambda = [2, 1] -> 0.5*[1,2] + 0.75*[3,0] = [2.75, 1]
    assert same_task_aggregate(masked, [2.0, 1.0], [1, 3], m_hat).tolist() == [2.75, 1.0]
    tau_hat, cross = t(1.0, 2.0), t(3.0, 2.0)
    assert combine(tau_hat, cross, 1.0, "mean").tolist() == [2.0, 2.0]
    assert combine(tau_hat, cross, 1.0, "sum").tolist() == [4.0, 4.0]
    assert combine(tau_hat, cross, 1.0, "none").tolist() == [1.0, 2.0]
    assert combine(tau_hat, cross, 3.0, "uniform").tolist() == [1.0, 1.0]


# -------------------------------------------------------------------------------------------------- server: aggregate


def test_aggregate_single_holder_gets_full_mask():
    up = upload(t(2.0, -1.0, 0.0, 3.0), {"a": b(True, True, False, False)}, {"a": 1.5}, {"a": 10})
    # masked = [2, -1, 0, 0]; alpha = [1, 1, 0, 0] -> m_hat = [1, 1, 0, 0]; tau_hat = 1 * 1.5 * [2, -1, 0, 0]
    assert agreement_mask(torch.stack([t(2.0, -1.0, 0.0, 0.0)])).tolist() == [1.0, 1.0, 0.0, 0.0]
    for mode in CROSS_TASK_MODES:  # one task: nothing to cross with, every mode agrees
        out = aggregate([up], cross_task=mode)
        assert list(out) == ["a"]
        close(out["a"], [3.0, -1.5, 0.0, 0.0])


def test_aggregate_one_client_none_mode_reconstructs_its_tasks():
    tau = torch.stack([t(1.0, -2.0, 0.5, 0.0, 3.0, -1.0), t(2.0, 1.0, -0.5, 0.0, -1.0, 1.0)])
    unified, masks, lam = unify(tau)
    up = upload(unified, {"x": masks[0], "y": masks[1]}, {"x": float(lam[0]), "y": float(lam[1])}, {"x": 3, "y": 9})
    out = aggregate([up], cross_task="none")
    close(out["x"], reconstruct(unified, masks[0], lam[0]))
    close(out["y"], reconstruct(unified, masks[1], lam[1]))


def test_aggregate_three_holders_rho_and_size_weights():
    ups = [
        upload(t(1.0, 2.0, 4.0, 1.0), {"a": b(True, True, True, True)}, {"a": 1.0}, {"a": 1}),
        upload(t(3.0, -2.0, 0.0, -1.0), {"a": b(True, True, True, False)}, {"a": 2.0}, {"a": 2}),
        upload(t(2.0, -2.0, -4.0, 5.0), {"a": b(True, True, True, True)}, {"a": 0.5}, {"a": 1}),
    ]
    # masked rows: [1,2,4,1], [3,-2,0,0], [2,-2,-4,5]
    # signs per column: (+,+,+) (+,-,-) (+,0,-) (+,0,+) -> alpha = [1, 1/3, 0, 2/3] -> m_hat = [1, 1/3, 0, 1]
    # gamma = [1,2,1]/4; gamma*lambda = [0.25, 1.0, 0.125]
    # sum: j0 0.25*1 + 1*3 + 0.125*2 = 3.5; j1 0.25*2 - 2 - 0.125*2 = -1.75; j2 1 + 0 - 0.5 = 0.5; j3 0.25 + 0.625
    # tau_hat = m_hat * [3.5, -1.75, 0.5, 0.875] = [3.5, -1.75/3, 0, 0.875]
    out = aggregate(ups)
    close(out["a"], [3.5, -1.75 / 3, 0.0, 0.875])
    # equal sizes change gamma to 1/3 each: gamma*lambda = [1/3, 2/3, 1/6]; j0 = 1/3 + 2 + 1/3 = 8/3
    for up in ups:
        up["sizes"] = {"a": 7}
    assert aggregate(ups)["a"][0].item() == pytest.approx(8 / 3)


def test_aggregate_task_without_holder_is_absent():
    ups = [
        upload(t(1.0, 0.0, 0.0, 0.0), {"a": b(True, True, True, True)}),
        upload(t(0.0, 1.0, 0.0, 0.0), {"b": b(True, True, True, True)}),
    ]
    out = aggregate(ups)
    assert set(out) == {"a", "b"}  # "c" (held by nobody in this round) is not returned; the caller keeps it
    assert "c" not in out
    assert aggregate([]) == {}


def _three_task_uploads():
    # One single-task client per task, lambda = 1: tau_hat^t = the masked vector, m_hat^t = 1 where it is non-zero.
    return [
        upload(t(1.0, 2.0, 0.0, -1.0), {"a": b(True, True, True, True)}),  # m_hat^a = [1, 1, 0, 1]
        upload(t(2.0, 1.0, 1.0, -2.0), {"b": b(True, True, True, True)}, sizes={"b": 3}),
        upload(t(1.0, -1.0, -2.0, -1.0), {"c": b(True, True, True, True)}),
    ]


def test_aggregate_cross_task_modes_hand_computed():
    ups = _three_task_uploads()
    before = [u["unified"].clone() for u in ups]
    # signs: a [+,+,0,-], b [+,+,+,-], c [+,-,-,-]
    # S(a,b) = 1/2 (3/4 + 1) = 7/8; S(a,c) = 1/2 ((1-1+0+1)/4 + 1) = 5/8; S(b,c) = 1/2 ((1-1-1+1)/4 + 1) = 1/2
    # eps = 0.5 strict: Z^a = [b, c], Z^b = [a], Z^c = [a]  (b-c at exactly 0.5 is out)
    # cross terms (mask of the receiving task):
    #   a: 7/8 * [1,1,0,1]*[2,1,1,-2] + 5/8 * [1,1,0,1]*[1,-1,-2,-1] = [1.75,0.875,0,-1.75] + [0.625,-0.625,0,-0.625]
    #      = [2.375, 0.25, 0, -2.375]
    #   b: 7/8 * [1,2,0,-1] = [0.875, 1.75, 0, -0.875];  c: 5/8 * [1,2,0,-1] = [0.625, 1.25, 0, -0.625]
    none = aggregate(ups, cross_task="none")
    close(none["a"], [1.0, 2.0, 0.0, -1.0])
    close(none["b"], [2.0, 1.0, 1.0, -2.0])
    close(none["c"], [1.0, -1.0, -2.0, -1.0])

    summed = aggregate(ups, cross_task="sum")
    close(summed["a"], [3.375, 2.25, 0.0, -3.375])  # [1,2,0,-1] + [2.375,0.25,0,-2.375]
    close(summed["b"], [2.875, 2.75, 1.0, -2.875])  # [2,1,1,-2] + [0.875,1.75,0,-0.875]
    close(summed["c"], [1.625, 0.25, -2.0, -1.625])  # [1,-1,-2,-1] + [0.625,1.25,0,-0.625]

    mean = aggregate(ups, cross_task="mean")
    close(mean["a"], [1.35, 0.9, 0.0, -1.35])  # sum / (1 + 7/8 + 5/8 = 2.5)
    close(mean["b"], [23 / 15, 22 / 15, 8 / 15, -23 / 15])  # sum / (1 + 7/8 = 15/8)
    close(mean["c"], [1.0, 2 / 13, -16 / 13, -1.0])  # sum / (1 + 5/8 = 13/8)
    assert aggregate(ups).keys() == mean.keys()
    for task in mean:  # "mean" is the default
        close(aggregate(ups)[task], mean[task])

    # uniform: every other task, weight 1, mask of t, divided by 1 + (3 - 1) = 3
    #   a: [1,2,0,-1] + [1,1,0,1]*([2,1,1,-2] + [1,-1,-2,-1]) = [1,2,0,-1] + [3,0,0,-3] = [4,2,0,-4]
    #   b: [2,1,1,-2] + ([1,2,0,-1] + [1,-1,-2,-1]) = [4,2,-1,-4];  c: [1,-1,-2,-1] + [3,3,1,-3] = [4,2,-1,-4]
    uniform = aggregate(ups, cross_task="uniform")
    close(uniform["a"], [4 / 3, 2 / 3, 0.0, -4 / 3])
    close(uniform["b"], [4 / 3, 2 / 3, -1 / 3, -4 / 3])
    close(uniform["c"], [4 / 3, 2 / 3, -1 / 3, -4 / 3])

    assert all(torch.equal(u["unified"], x) for u, x in zip(ups, before, strict=True))


def test_aggregate_kappa_and_eps_limit_neighbours():
    ups = _three_task_uploads()
    # kappa = 1: Z^a = [b] only -> a = ([1,2,0,-1] + [1.75,0.875,0,-1.75]) / (1 + 7/8) = [2.75,2.875,0,-2.75] / (15/8)
    out = aggregate(ups, kappa=1)
    close(out["a"], [22 / 15, 23 / 15, 0.0, -22 / 15])
    close(out["b"], aggregate(ups)["b"])
    # eps = 0.7: only S(a,b) = 7/8 passes -> a as with kappa = 1, c has no neighbour and keeps tau_hat^c
    out = aggregate(ups, eps=0.7)
    close(out["a"], [22 / 15, 23 / 15, 0.0, -22 / 15])
    close(out["c"], [1.0, -1.0, -2.0, -1.0])
    # kappa = 0: no cross term at all, "mean" reduces to "none"
    out = aggregate(ups, kappa=0)
    for task, vec in aggregate(ups, cross_task="none").items():
        close(out[task], vec)
    assert DEFAULT_KAPPA == 2


def test_aggregate_top_kappa_tie_breaks_by_task_name_regardless_of_upload_order():
    ups = [
        upload(t(1.0, 1.0, -1.0, 1.0), {"b": b(True, True, True, True)}),
        upload(t(1.0, 1.0, 1.0, 1.0), {"c": b(True, True, True, True)}),
        upload(t(1.0, 1.0, 1.0, -1.0), {"a": b(True, True, True, True)}),
    ]
    # S(c,a) = S(c,b) = 1/2 (2/4 + 1) = 0.75 (tie), S(a,b) = 1/2; kappa = 1 -> Z^c = [a] by name
    # c = [1,1,1,1] + 0.75 * [1,1,1,-1] = [1.75, 1.75, 1.75, 0.25]
    out = aggregate(ups, kappa=1, cross_task="sum")
    assert list(out) == ["a", "b", "c"]
    close(out["c"], [1.75, 1.75, 1.75, 0.25])
    close(aggregate(list(reversed(ups)), kappa=1, cross_task="sum")["c"], out["c"])


def test_aggregate_multi_task_client_shares_one_unified_vector():
    up = upload(
        t(2.0, -1.0, 3.0, 0.0),
        {"a": b(True, False, True, False), "b": b(False, True, True, False)},
        {"a": 2.0, "b": 0.5},
        {"a": 3, "b": 4},
    )
    # tau_hat^a = 2 * [2,0,3,0] = [4,0,6,0]; tau_hat^b = 0.5 * [0,-1,3,0] = [0,-0.5,1.5,0]
    none = aggregate([up], cross_task="none")
    close(none["a"], [4.0, 0.0, 6.0, 0.0])
    close(none["b"], [0.0, -0.5, 1.5, 0.0])
    # S(a,b) = 1/2 (1/4 + 1) = 5/8 > 0.5
    # a: ([4,0,6,0] + 5/8 * [1,0,1,0]*[0,-0.5,1.5,0]) / (13/8) = [4,0,6.9375,0] / 1.625 = [32/13, 0, 111/26, 0]
    # b: ([0,-0.5,1.5,0] + 5/8 * [0,1,1,0]*[4,0,6,0]) / (13/8) = [0,-0.5,5.25,0] / 1.625 = [0, -4/13, 42/13, 0]
    mean = aggregate([up])
    close(mean["a"], [32 / 13, 0.0, 111 / 26, 0.0])
    close(mean["b"], [0.0, -4 / 13, 42 / 13, 0.0])


def test_co_held_tasks_never_conflict_in_sign_after_unification():
    """Why sign similarity rises for tasks that the same clients hold (docs/matu.md): the client's unification
    erases their conflicts before the server sees them. Two independent random task vectors agree on about half
    their signs (S ≈ 1/2); uploaded by one client they never disagree, so S ≈ 1/2 + 1/2 · 1/2 = 3/4; uploaded by
    two clients they keep S ≈ 1/2."""
    gen = torch.Generator().manual_seed(0)
    tau = torch.randn(2, 20_000, generator=gen)
    assert float(task_similarity(tau)[0, 1]) == pytest.approx(0.5, abs=0.01)

    unified, masks, rescalers = unify(tau)
    together = aggregate([upload(unified, {"a": masks[0], "b": masks[1]}, {"a": float(rescalers[0]),
                                                                           "b": float(rescalers[1])})],
                         cross_task="none")
    signs = torch.sign(together["a"]) * torch.sign(together["b"])
    assert int((signs < 0).sum()) == 0
    assert float(task_similarity(torch.stack([together["a"], together["b"]]))[0, 1]) == pytest.approx(0.75, abs=0.01)

    apart = aggregate([upload(tau[0], {"a": tau[0] != 0}), upload(tau[1], {"b": tau[1] != 0})], cross_task="none")
    assert float(task_similarity(torch.stack([apart["a"], apart["b"]]))[0, 1]) == pytest.approx(0.5, abs=0.01)


def test_mean_mixing_is_a_consensus_step_over_the_neighbour_graph():
    """Why MaTU's task vectors homogenize on digits (docs/matu.md): `mean` replaces each task's vector by a weighted
    average of itself and its neighbours', so rounds of it drive every connected component of the neighbour graph
    to one vector. Two clusters whose signs disagree (S ≈ 1/3 across, 2/3 within): with ε = 0.5 the graph splits
    and only each cluster agrees on a vector; with ε = 0 it is connected and all four tasks end up at one vector."""
    gen = torch.Generator().manual_seed(0)
    base, noise = torch.randn(5000, generator=gen), torch.randn(4, 5000, generator=gen)
    start = {"a1": base + noise[0], "a2": base + noise[1], "b1": -base + noise[2], "b2": -base + noise[3]}
    similarity = task_similarity(torch.stack(list(start.values())))
    assert float(similarity[0, 1]) == pytest.approx(2 / 3, abs=0.02)
    assert float(similarity[0, 2]) == pytest.approx(1 / 3, abs=0.03)

    def after_rounds(eps: float, rounds: int = 10) -> dict:
        vectors = dict(start)
        for _ in range(rounds):  # one single-task holder per task, no training in between
            vectors = aggregate([upload(v, {task: v != 0}) for task, v in vectors.items()], eps=eps)
        return vectors

    def gap(vectors: dict, a: str, b: str) -> float:
        return float((vectors[a] - vectors[b]).norm() / vectors[a].norm())

    split = after_rounds(eps=0.5)
    assert gap(split, "a1", "a2") < 1e-3 and gap(split, "b1", "b2") < 1e-3
    assert gap(split, "a1", "b1") > gap(start, "a1", "b1")
    connected = after_rounds(eps=0.0)
    assert gap(connected, "a1", "b1") < 0.01 * gap(start, "a1", "b1")


def test_aggregate_validation_errors():
    ups = _three_task_uploads()
    with pytest.raises(ValueError, match="mean, sum, none, uniform"):
        aggregate(ups, cross_task="average")
    with pytest.raises(ValueError, match="d=5"):
        aggregate([*ups, upload(torch.zeros(5), {"d": torch.ones(5, dtype=torch.bool)})])
    with pytest.raises(ValueError, match="mask has shape"):
        aggregate([upload(torch.zeros(4), {"a": b(True, False)})])
    with pytest.raises(ValueError, match="same tasks"):
        aggregate([{"unified": torch.zeros(4), "masks": {"a": b(*[True] * 4)}, "rescalers": {}, "sizes": {"a": 1}}])
    with pytest.raises(ValueError, match="missing"):
        aggregate([{"unified": torch.zeros(4)}])
    with pytest.raises(ValueError, match="kappa"):
        aggregate(ups, kappa=-1)
