"""Non-negative least squares (adaptiveload.fit.nnls) against a brute-force reference."""

import itertools

import numpy as np
import pytest

from adaptiveload.fit import Point, fit_cost_model, heldout_errors, nnls

SEEDS = list(range(60))


def brute_force_nnls(a, b):
    """The NNLS minimum by enumeration: it is the least-squares solution on the subset of
    columns where it is positive, so the best of the subsets whose least-squares solution
    is >= 0 is it. 2^n solves: a handful of columns only. Solved on unit columns (scaling
    a column by c > 0 scales its coefficient by 1/c), so that columns of very different
    sizes keep full precision."""
    n = a.shape[1]
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    unit = a / norms
    best, best_res = np.zeros(n), np.linalg.norm(b)
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            x = np.zeros(n)
            x[list(cols)] = np.linalg.lstsq(unit[:, list(cols)], b, rcond=None)[0]
            res = np.linalg.norm(unit @ x - b)
            if np.all(x >= 0) and res < best_res:
                best, best_res = x, res
    return best / norms


def random_problem(seed):
    """A full-column-rank (m, n) Gaussian problem (so its NNLS solution is unique) and a
    random column scaling over 12 orders of magnitude, as in the cost fit's columns."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    m = int(rng.integers(n, 3 * n + 6))
    scale = 10.0 ** rng.uniform(-6, 6, n) if seed % 2 else np.ones(n)
    return rng.standard_normal((m, n)) * scale, rng.standard_normal(m), scale


def assert_kkt(a, b, x, rtol=1e-9):
    """x >= 0; the gradient g = a^T (a x - b) of 0.5 ||a x - b||^2 is >= 0 where x = 0 and
    0 where x > 0 (to rtol of its scale |a_j| |b|)."""
    g = a.T @ (a @ x - b)
    tol = rtol * np.linalg.norm(a, axis=0) * np.linalg.norm(b)
    assert np.all(x >= 0)
    zero = x == 0
    assert np.all(g[zero] >= -tol[zero]), (g, x)
    assert np.all(np.abs(g[~zero]) <= tol[~zero]), (g, x)


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_brute_force_on_random_problems(seed):
    a, b, scale = random_problem(seed)
    x = nnls(a, b)
    ref = brute_force_nnls(a, b)
    # Compared in unit-column coordinates, where the coefficients are O(1).
    np.testing.assert_allclose(x * scale, ref * scale, rtol=1e-7, atol=1e-9)
    assert np.linalg.norm(a @ x - b) <= np.linalg.norm(a @ ref - b) * (1 + 1e-12) + 1e-12
    assert_kkt(a, b, x)


@pytest.mark.parametrize("seed", SEEDS[:30])
def test_negative_unconstrained_solution(seed):
    # Targets from coefficients of both signs: the plain least-squares solution has a
    # negative coefficient, so the NNLS one lies on the boundary (some coefficient 0).
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(2, 7))
    m = int(rng.integers(n + 1, 4 * n + 4))
    a = rng.standard_normal((m, n))
    truth = rng.standard_normal(n)
    truth[rng.integers(n)] = -2.0
    b = a @ truth + 0.01 * rng.standard_normal(m)
    assert np.linalg.lstsq(a, b, rcond=None)[0].min() < 0
    x = nnls(a, b)
    np.testing.assert_allclose(x, brute_force_nnls(a, b), rtol=1e-7, atol=1e-9)
    assert np.any(x == 0)
    assert_kkt(a, b, x)


@pytest.mark.parametrize("seed", SEEDS[:30])
def test_recovers_non_negative_ground_truth_exactly(seed):
    rng = np.random.default_rng(2000 + seed)
    n = int(rng.integers(1, 7))
    m = int(rng.integers(n, 3 * n + 6))
    scale = 10.0 ** rng.uniform(-8, 8, n)
    a = rng.standard_normal((m, n)) * scale
    truth = rng.uniform(0.5, 2.0, n) / scale
    truth[rng.random(n) < 0.3] = 0.0
    x = nnls(a, a @ truth)
    np.testing.assert_allclose(x * scale, truth * scale, rtol=1e-9, atol=1e-9)
    assert_kkt(a, a @ truth, x)


def test_reenters_a_coefficient_that_dropping_the_most_negative_would_lose():
    # Unconstrained solution (-3, -2). Dropping the most negative coefficient and refitting
    # gives x1 < 0, then x = 0 (residual sqrt 5); the minimum is x = (1, 0) (residual 2).
    a = np.array([[-1.0, 2.0], [0.0, -1.0]])
    b = np.array([-1.0, 2.0])
    np.testing.assert_allclose(np.linalg.solve(a, b), [-3.0, -2.0])
    np.testing.assert_allclose(nnls(a, b), [1.0, 0.0], atol=1e-12)


def test_edge_cases():
    # All-zero columns get 0; targets that every column points away from give x = 0.
    a = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(nnls(a, np.array([2.0, 2.0, 5.0])), [2.0, 0.0])
    np.testing.assert_array_equal(nnls(np.eye(3), -np.ones(3)), np.zeros(3))
    np.testing.assert_array_equal(nnls(np.ones((4, 2)), np.zeros(4)), np.zeros(2))
    # Fewer rows than columns: a minimizer (not unique), still feasible and optimal.
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, 5)), rng.standard_normal(2)
    x = nnls(a, b)
    ref = brute_force_nnls(a, b)
    assert np.linalg.norm(a @ x - b) == pytest.approx(np.linalg.norm(a @ ref - b), abs=1e-9)
    assert_kkt(a, b, x)


def test_rejects_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        nnls(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ValueError, match="shape"):
        nnls(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="finite"):
        nnls(np.array([[1.0], [np.nan]]), np.ones(2))
    with pytest.raises(RuntimeError, match="no convergence"):
        nnls(np.eye(2), np.ones(2), max_iter=1)


def test_matches_scipy_when_installed():
    optimize = pytest.importorskip("scipy.optimize")
    for seed in SEEDS[:20]:
        a, b, scale = random_problem(seed)
        np.testing.assert_allclose(
            nnls(a, b) * scale, optimize.nnls(a, b)[0] * scale, rtol=1e-6, atol=1e-8
        )


def floor_points(h0, c0, c1, c2, noise, seed):
    """Micro-batches of time max(h0, c0 + B*(c1*S + c2*S^2)), with relative noise."""
    rng = np.random.default_rng(seed)
    pts = []
    for s in (256, 1560, 3600, 7800, 14040, 32760, 75600):
        for b in (1, 2, 4, max(1, 151200 // s // 2), max(1, 151200 // s)):
            t = max(h0, c0 + b * (c1 * s + c2 * s * s)) * (1 + noise * rng.standard_normal())
            pts.append(Point(b, s, float(t), 0))
    return pts


def test_auto_form_finds_a_launch_floor_and_recovers_it():
    pts = floor_points(h0=15.0, c0=0.5, c1=1e-3, c2=4e-8, noise=0.0, seed=0)
    model = fit_cost_model(pts)
    assert model.meta["form"] == "floor"
    d = model.to_dict()
    assert d["floor"]["h0"] + d["floor"]["hs"] == pytest.approx(15.0, rel=1e-3)
    assert max(abs(p.rel_error) for p in pts) < 1e-3
    held = model.meta["heldout"]
    assert held["floor"]["p90"] < held["additive"]["p90"]
    # The additive form cannot express the floor: it misses somewhere by more than 10%.
    pts = floor_points(15.0, 0.5, 1e-3, 4e-8, 0.0, 0)
    additive = fit_cost_model(pts, form="additive")
    assert "floor" not in additive.to_dict()
    assert max(abs(p.rel_error) for p in pts) > 0.1


def test_auto_form_keeps_the_additive_form_without_a_floor():
    rng = np.random.default_rng(5)
    pts = [
        Point(
            b,
            s,
            (2.0 + b * (0.3 + 2e-3 * s + 1e-7 * s * s)) * (1 + 0.01 * rng.standard_normal()),
            0,
        )
        for s in (1560, 3600, 7800, 14040, 32760, 75600)
        for b in (1, 2, max(1, 151200 // s))
    ]
    model = fit_cost_model(pts)
    assert model.meta["form"] == "additive"
    assert np.median([abs(p.rel_error) for p in pts]) < 0.02


def test_heldout_errors_cover_every_point_and_reject_bad_forms():
    pts = floor_points(h0=15.0, c0=0.5, c1=1e-3, c2=4e-8, noise=0.01, seed=2)
    e = heldout_errors(pts, "floor", folds=5)
    assert e.shape == (len(pts),) and np.all(np.isfinite(e))
    assert np.median(np.abs(e)) < 0.05
    with pytest.raises(ValueError, match="form must be one of"):
        fit_cost_model(pts, form="cubic")
    with pytest.raises(ValueError, match="fewer than 4"):
        heldout_errors(pts[:6], "additive", folds=2)


def test_a_form_whose_held_out_fit_fails_loses_instead_of_aborting_the_fit():
    # Flat times but for one large micro-batch: a fold that holds it out has nothing that grows
    # with tokens, so neither form can be fitted there (noisy timings on a busy machine gave such
    # folds); the fit over all points still can, and must not raise for the folds.
    pts = [Point(b, s, 10.0 * (1 - 2e-6 * b * s), 0) for s in (256, 1560, 3600) for b in (1, 2, 4)]
    pts.append(Point(8, 32760, 500.0, 0))
    model = fit_cost_model(pts)
    assert model.meta["form"] == "additive"
    assert all(
        v["p90"] is None and "do not grow" in v["failed"] for v in model.meta["heldout"].values()
    )
    assert model.batch_cost([32760] * 8) > model.batch_cost([256])
