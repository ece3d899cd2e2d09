"""Fitting the sampler's cost and memory models to measured micro-batches.

``fit_cost_model`` fits one of two forms (``COST_FORMS``) of time (ms) to ``Point``
measurements of micro-batches of B samples of S tokens, and with ``form="auto"`` picks the one
with the smaller held-out error (``heldout_errors``, k-fold):

- ``"additive"``: ``time = c0 + B * (cs + c1*S + c2*S^2)``;
- ``"floor"``: ``time = max(h0 + hs*B, c0 + B * (cs + c1*S + c2*S^2))``: micro-batches of small
  samples do not go below the host's launch time (the GPU waits on it), which the additive form
  can only fit by over-predicting large batches of them.

``fit_memory_model`` fits ``peak = m0 + m1 * B * S`` (bytes); ``fit_checkpoint_memory_model``
fits the peak with ``n`` of ``L`` blocks checkpointed (``adaptiveload.memory.MemoryModel``), its
margin and the share of time recomputation takes. All by non-negative least squares
(``nnls``: scipy's, on unit columns). ``adaptiveload.calibrate`` measures the points on a GPU; any other
source of points works the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from adaptiveload.cost import CostModel


@dataclass
class Point:
    """One measured micro-batch: ``batch`` samples of ``seq_len`` tokens took ``ms``
    milliseconds and peaked at ``peak_bytes``; ``predicted_ms`` is filled in by the fit.
    ``degree`` > 1: one rank's share of it split that many ways (sequence parallelism),
    which the fitted forms leave out (``whole``)."""

    batch: int
    seq_len: int
    ms: float
    peak_bytes: int
    shape: tuple[int, int, int] | None = None
    predicted_ms: float | None = None
    degree: int = 1

    @property
    def kind(self) -> tuple[int, ...]:
        """``(seq_len, batch)``, or ``(seq_len, batch, degree)`` for a share: the key of
        ``CostModel.with_measured``."""
        return (self.seq_len, self.batch) + ((self.degree,) if self.degree > 1 else ())

    @property
    def rel_error(self) -> float | None:
        return None if self.predicted_ms is None else (self.predicted_ms - self.ms) / self.ms


def nnls(a, b, *, max_iter: int | None = None) -> np.ndarray:
    """x minimizing ``||a @ x - b||_2`` subject to ``x >= 0``: ``scipy.optimize.nnls``
    (Lawson and Hanson's active-set algorithm) on unit columns.

    ``x_j >= 0`` is unchanged by scaling column j by a positive number, so the columns are
    scaled to unit norm first: the cost fit's columns (1, B*S, B*S^2) span orders of
    magnitude, and the solver's gradient test then compares them on one scale.

    Args:
        a: (m, n) design matrix; b: (m,) targets; both finite.
        max_iter: the solver's iterations at most (default 3 n); ``RuntimeError`` past it.

    Returns:
        x, shape (n,), float64, every entry >= 0 (0 for all-zero columns of ``a``).
    """
    from scipy.optimize import nnls as scipy_nnls

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise ValueError(
            f"nnls: need a of shape (m, n) and b of shape (m,), got {a.shape}, {b.shape}"
        )
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("nnls: a and b must be finite")
    n = a.shape[1]
    max_iter = 3 * n if max_iter is None else int(max_iter)
    norms = np.linalg.norm(a, axis=0)
    usable = norms > 0
    x = np.zeros(n)
    if usable.any():
        try:
            x[usable] = scipy_nnls(a[:, usable] / norms[usable], b, maxiter=max_iter)[0]
        except RuntimeError as e:
            raise RuntimeError(f"nnls: no convergence after {max_iter} iterations ({e})") from None
    return np.where(usable, x / np.where(usable, norms, 1.0), 0.0)


COST_FORMS = ("additive", "floor")


def _design(b: np.ndarray, s: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(s), b, b * s, b * s * s], axis=1)


def _fit_additive(b, s, t) -> tuple[np.ndarray, np.ndarray]:
    """(c0, cs, c1, c2) by NNLS on relative error, and no floor."""
    return nnls(_design(b, s) / t[:, None], np.ones_like(t)), np.zeros(2)


def _fit_floor(b, s, t) -> tuple[np.ndarray, np.ndarray]:
    """(c0, cs, c1, c2) and (h0, hs) of ``max(h0 + hs*B, work)`` by alternating NNLS: points
    are split into floor-bound and work-bound, each part fitted, the split redrawn from the
    fit, until it no longer changes; the best of several starting splits is kept."""
    work_a = _design(b, s) / t[:, None]
    floor_a = np.stack([np.ones_like(b), b], axis=1) / t[:, None]
    ones = np.ones_like(t)
    best = None
    for q in (0.1, 0.2, 0.3, 0.4, 0.5):
        on_floor = t <= np.quantile(t, q)
        for _ in range(50):
            if on_floor.sum() < 1 or (~on_floor).sum() < 4:
                break
            c = nnls(work_a[~on_floor], ones[~on_floor])
            h = nnls(floor_a[on_floor], ones[on_floor])
            now = (floor_a @ h) > (work_a @ c)
            if np.array_equal(now, on_floor):
                break
            on_floor = now
        if on_floor.sum() < 1 or (~on_floor).sum() < 4:
            continue
        c = nnls(work_a[~on_floor], ones[~on_floor])
        h = nnls(floor_a[on_floor], ones[on_floor])
        loss = float(np.sum((np.maximum(floor_a @ h, work_a @ c) - 1) ** 2))
        if best is None or loss < best[0]:
            best = (loss, c, h)
    if best is None:
        return _fit_additive(b, s, t)
    return best[1], best[2]


def _arrays(pts: list[Point]):
    if len(pts) < 4:
        raise ValueError(f"need at least 4 calibration points, got {len(pts)}")
    b = np.array([p.batch for p in pts], float)
    s = np.array([p.seq_len for p in pts], float)
    t = np.array([p.ms for p in pts], float)
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("calibration times must be > 0")
    return b, s, t


def _fit_form(form: str, b, s, t) -> CostModel:
    if form not in COST_FORMS:
        raise ValueError(f"form must be one of {COST_FORMS} or 'auto', got {form!r}")
    (c0, cs, c1, c2), (h0, hs) = (_fit_additive if form == "additive" else _fit_floor)(b, s, t)
    if c1 + c2 <= 0:
        raise ValueError("calibration points do not grow with tokens; cannot fit a cost model")
    model = CostModel.polynomial(c0, c1, c2, per_sample=cs, unit="ms")
    return model.with_floor(h0, hs) if h0 or hs else model


def _predict(model: CostModel, b, s) -> np.ndarray:
    return model.uniform_costs(s.astype(np.int64), b.astype(np.int64))


def heldout_errors(points: Iterable[Point], form: str, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Relative errors ``(predicted - measured) / measured`` of ``form`` on each point when
    fitted to the other folds (``folds`` random folds; leave-one-out when ``folds`` >= the
    number of points)."""
    pts = list(points)
    b, s, t = _arrays(pts)
    n = len(pts)
    fold = np.random.default_rng(seed).permutation(n) % min(folds, n)
    err = np.empty(n)
    for f in range(min(folds, n)):
        test = fold == f
        if (~test).sum() < 4:
            raise ValueError(f"heldout_errors: {folds} folds leave fewer than 4 points to fit")
        model = _fit_form(form, b[~test], s[~test], t[~test])
        err[test] = (_predict(model, b[test], s[test]) - t[test]) / t[test]
    return err


def fit_cost_model(points: Iterable[Point], form: str = "auto", folds: int = 5) -> CostModel:
    """Fit ``form`` (one of ``COST_FORMS``; ``"auto"``: the one whose held-out relative
    errors, ``heldout_errors``, have the smaller 90th percentile, ties to the simpler) with
    coefficients >= 0 to the points' relative error ``(predicted - measured) / measured`` by
    ``nnls``. ``cs`` is work per sample that does not grow with S (e.g. the text
    conditioning). Fills each point's ``predicted_ms``; the model's ``meta`` records the form
    and, for ``"auto"``, each form's held-out median and 90th percentile error (``None``, with
    the reason under ``"failed"``, for a form that one of the folds cannot fit: such a form
    loses; when every form fails there, the additive form is fitted to all points)."""
    pts = list(points)
    b, s, t = _arrays(pts)
    meta: dict = {}
    if form == "auto":
        scores, held = {}, {}
        for f in COST_FORMS:
            if len(pts) < 8:
                break
            try:
                e = np.abs(heldout_errors(pts, f, folds))
            except ValueError as err:  # a fold's points do not grow with tokens (noisy times)
                held[f] = {"p90": None, "median": None, "failed": str(err)}
                continue
            scores[f] = (float(np.percentile(e, 90)), float(np.median(e)))
            held[f] = {"p90": scores[f][0], "median": scores[f][1]}
        form = (
            min(scores, key=lambda f: scores[f][0] * (1 + 1e-9 * COST_FORMS.index(f)))
            if scores
            else "additive"
        )
        meta["heldout"] = held
    model = _fit_form(form, b, s, t)
    model.meta = {"form": form, **meta}
    for p, pred in zip(pts, _predict(model, b, s), strict=True):
        p.predicted_ms = float(pred)
    return model


def fit_memory_model(points: Iterable[Point]) -> tuple[float, float]:
    """``peak = m0 + m1 * B * S`` in bytes, ``m0, m1 >= 0``, least squares on absolute
    error by ``nnls``. Returns ``(m0, m1)``."""
    pts = list(points)
    tokens = np.array([p.batch * p.seq_len for p in pts], float)
    peak = np.array([p.peak_bytes for p in pts], float)
    m0, m1 = nnls(np.stack([np.ones_like(tokens), tokens], axis=1), peak)
    return float(m0), float(m1)


# Added to the worst leave-one-out under-prediction to make the policy's margin: the
# allocator's rounding and fragmentation between calibration and training.
MEMORY_SLACK = 0.02


def _checkpoint_design(batch, tokens, n, num_blocks) -> np.ndarray:
    """Columns of m0, mb, mbk, mt, ma, mr (see MemoryModel). ``mc`` (a checkpointed block's saved
    input, ~1/40 of its activations at Wan shapes) is not fitted: with the few ``n`` a
    calibration measures it is nearly collinear with ``mt`` and ``ma``."""
    kept = np.maximum(num_blocks - n, 1)
    return np.stack(
        [np.ones_like(tokens), batch, batch * kept, tokens, tokens * kept, tokens * (n > 0)],
        axis=1,
    )


def fit_checkpoint_memory_model(rows, num_blocks: int, *, slack: float = MEMORY_SLACK):
    """Fit ``MemoryModel`` to measured rows (dicts with ``batch``, ``tokens`` or ``seq_len``,
    ``checkpointed``, ``peak_bytes`` and optionally ``ms``) of a model of ``num_blocks``
    blocks. Least squares on relative error (small micro-batches count as much as large
    ones), coefficients >= 0.

    The margin is the worst leave-one-out under-prediction (each point predicted by the fit
    of the others), plus ``slack``: so on measured points, peak <= prediction * (1 + margin)
    with room for points not measured. ``recompute_share`` is the median, over rows with
    ``n < L`` and a row of the same ``(seq_len, batch)`` at ``n = L``, of
    ``(1 - ms(n) / ms(L)) * L / (L - n)``. ``meta`` holds the errors."""
    from adaptiveload.memory import MemoryModel

    rows = list(rows)
    if len(rows) < 3:
        raise ValueError(f"fit_checkpoint_memory_model: need >= 3 rows, got {len(rows)}")
    batch = np.array([r["batch"] for r in rows], float)
    tokens = np.array([r.get("tokens", r.get("seq_len", 0) * r["batch"]) for r in rows], float)
    n = np.array([r["checkpointed"] for r in rows], float)
    peak = np.array([r["peak_bytes"] for r in rows], float)
    if (peak <= 0).any():
        raise ValueError("fit_checkpoint_memory_model: every row needs peak_bytes > 0")
    if ((n < 0) | (n > num_blocks)).any():
        raise ValueError(f"fit_checkpoint_memory_model: checkpointed must be in [0, {num_blocks}]")
    a = _checkpoint_design(batch, tokens, n, num_blocks) / peak[:, None]
    ones = np.ones_like(peak)
    coef = nnls(a, ones)
    pred = a @ coef * peak
    loo_under = 0.0
    for i in range(len(rows)):
        keep = np.arange(len(rows)) != i
        c = nnls(a[keep], ones[keep])
        p = float(a[i] @ c * peak[i])
        loo_under = max(loo_under, (peak[i] - p) / p)
    in_sample = (pred - peak) / peak

    shares = []
    by_kind = {}
    for r in rows:
        if "ms" in r and r.get("seq_len") is not None:
            by_kind.setdefault((r["seq_len"], r["batch"]), {})[int(r["checkpointed"])] = r["ms"]
    for times in by_kind.values():
        full = times.get(num_blocks)
        for k, ms in times.items():
            if full and k < num_blocks:
                shares.append((1.0 - ms / full) * num_blocks / (num_blocks - k))
    share = float(np.clip(np.median(shares), 0.0, 0.9)) if shares else 0.0
    margin = max(0.0, loo_under) + slack
    return MemoryModel(
        num_blocks,
        **dict(zip(("m0", "mb", "mbk", "mt", "ma", "mr"), (float(c) for c in coef), strict=True)),
        margin=round(margin, 4),
        recompute_share=round(share, 4),
        meta={
            "rows": len(rows),
            "error_median": float(np.median(np.abs(in_sample))),
            "error_max": float(np.abs(in_sample).max()),
            "under_max": float(max(0.0, -in_sample.min())),
            "loo_under_max": float(max(0.0, loo_under)),
            "slack": slack,
            "recompute_shares": len(shares),
        },
    )


__all__ = [
    "COST_FORMS",
    "MEMORY_SLACK",
    "Point",
    "fit_checkpoint_memory_model",
    "fit_cost_model",
    "fit_memory_model",
    "heldout_errors",
    "nnls",
]
