"""Cost models: the predicted time of a micro-batch from its samples' token counts."""

from __future__ import annotations

import json
import os
from importlib import resources

import numpy as np

from adaptiveload import _sampler

_BUILTIN = "wan21_h200.json"


def _builtin_profiles() -> dict:
    with resources.files("adaptiveload.data").joinpath(_BUILTIN).open() as f:
        return json.load(f)


class CostModel:
    """Predicted cost of a micro-batch, in three layers (the first that applies wins):

    1. **measured kinds** (``with_measured``): a micro-batch of ``B`` samples of ``S`` tokens
       each whose ``(S, B)`` was measured costs what was measured (plan-aware calibration and
       online refinement fill these in); with sequence parallelism, one rank's share of it
       split ``d`` ways costs what ``(S, B, d)`` was measured at, where it was (``measured_shares``);
    2. **the fitted form**: ``cost(batch) = max(h0 + hs * B, c0 + sum_i f(S_i))``, with

       - ``CostModel.power(p)``: ``f(S) = coef * S**p``, ``c0 = 0`` (the paper's ``B x S^p``);
       - ``CostModel.polynomial(c0, c1, c2, per_sample=cs)``: ``f(S) = cs + c1*S + c2*S**2``
         (per-sample work such as text conditioning, linear layers, quadratic attention);
         calibrated profiles are of this form, in milliseconds;

       and the floor ``h0 + hs * B`` (``with_floor``; 0 unless fitted): the time a micro-batch
       of small samples does not go below, because the GPU waits on the host's launches.

    Only ratios between micro-batches matter for balancing; ``max_cost`` is in the same unit.
    """

    def __init__(self, core: _sampler.CostModel, *, unit: str = "", meta: dict | None = None):
        self._core = core
        self.unit = unit
        self.meta = dict(meta or {})

    @property
    def native(self):
        """The C++ model (``_sampler.CostModel``) the planner's sample table reads."""
        return self._core

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def power(cls, p: float = 1.5, coef: float = 1.0) -> CostModel:
        return cls(_sampler.CostModel.power(float(p), float(coef)), unit=f"token^{p:g}")

    @classmethod
    def polynomial(
        cls, c0: float, c1: float, c2: float, *, per_sample: float = 0.0, unit: str = "ms"
    ) -> CostModel:
        return cls(
            _sampler.CostModel.polynomial(float(c0), float(c1), float(c2), float(per_sample)),
            unit=unit,
        )

    @classmethod
    def wan21_h200(cls, size: str = "14B", layers: int | None = None) -> CostModel:
        """Built-in profile: Wan 2.1 ``size`` ("1.3B" or "14B") forward+backward in ms on one
        H200, ``layers`` blocks (default: the full model), fitted to block measurements."""
        profiles = _builtin_profiles()["configs"]
        if size not in profiles:
            raise ValueError(
                f"CostModel.wan21_h200: size must be one of {sorted(profiles)}, got {size!r}"
            )
        cfg = profiles[size]
        n = cfg["layers"] if layers is None else int(layers)
        if n < 1:
            raise ValueError(f"CostModel.wan21_h200: layers must be >= 1, got {layers}")
        c = cfg["block_ms"]
        model = cls.polynomial(
            n * c["c0"], n * c["c1"], n * c["c2"], per_sample=n * c.get("cs", 0.0), unit="ms"
        ).with_split_kept(n * c.get("k0", 0.0), n * c.get("k1", 0.0))
        model.meta = {
            "source": f"wan21_h200:{size}",
            "layers": n,
            "hidden": cfg["dim"],
            "heads": cfg["heads"],
        }
        return model

    @classmethod
    def default(cls) -> CostModel:
        """The model used when none is given: Wan 2.1 14B on an H200 (see ``wan21_h200``).
        Its attention share (the S^2 term) is typical of video DiTs; calibrate for your own."""
        return cls.wan21_h200("14B")

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> CostModel:
        with open(path) as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(d, source=str(path))

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "dict") -> CostModel:
        kind = d.get("kind")
        try:
            if kind == "power":
                model = cls.power(d["p"], d.get("coef", 1.0))
            elif kind == "polynomial":
                model = cls.polynomial(
                    d["c0"],
                    d["c1"],
                    d["c2"],
                    per_sample=d.get("per_sample", 0.0),
                    unit=d.get("unit", "ms"),
                )
            else:
                raise ValueError(f"{source}: 'kind' must be 'power' or 'polynomial', got {kind!r}")
            if "floor" in d:
                model = model.with_floor(d["floor"]["h0"], d["floor"]["hs"])
            if "split_kept" in d:
                model = model.with_split_kept(d["split_kept"]["k0"], d["split_kept"]["k1"])
            if d.get("measured"):
                model = model.with_measured(
                    [
                        (
                            int(k["seq_len"]),
                            int(k["batch"]),
                            int(k.get("degree", 1)),
                            float(k["cost"]),
                        )
                        for k in d["measured"]
                    ]
                )
        except KeyError as e:
            raise ValueError(
                f"{source}: missing field {e.args[0]!r} for a {kind} cost model"
            ) from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from None
        model.meta = dict(d.get("meta", {}))
        return model

    def to_dict(self) -> dict:
        c = self._core
        if c.is_power:
            d = {"kind": "power", "p": c.p, "coef": c.coef}
        else:
            d = {
                "kind": "polynomial",
                "c0": c.c0,
                "c1": c.c1,
                "c2": c.c2,
                "per_sample": c.cs,
                "unit": self.unit,
            }
        if c.h0 or c.hs:
            d["floor"] = {"h0": c.h0, "hs": c.hs}
        if c.k0 or c.k1:
            d["split_kept"] = {"k0": c.k0, "k1": c.k1}
        if c.num_measured:
            d["measured"] = [
                {"seq_len": s, "batch": b, "cost": cost, **({"degree": g} if g > 1 else {})}
                for s, b, cost, g in c.measured()
            ]
        if self.meta:
            d["meta"] = self.meta
        return d

    def to_json(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")

    # Pickle and deepcopy through the JSON form (the C++ core is not picklable).
    def __getstate__(self) -> dict:
        return self.to_dict()

    def __setstate__(self, state: dict) -> None:
        other = CostModel.from_dict(state, source="pickled CostModel")
        self._core, self.unit, self.meta = other._core, other.unit, other.meta

    # -- layers -------------------------------------------------------------------------
    def with_floor(self, h0: float, hs: float = 0.0) -> CostModel:
        """A copy whose fitted form has the floor ``h0 + hs * B``."""
        return CostModel(
            self._core.with_floor(float(h0), float(hs)), unit=self.unit, meta=self.meta
        )

    def with_split_kept(self, k0: float, k1: float = 0.0) -> CostModel:
        """A copy whose shares (sequence parallelism) keep ``k0 + k1 * S`` of each sample of
        ``S`` tokens whole: the part of its cost a share over ``d`` ranks still pays in full
        rather than ``1/d`` of (the text's projections, the timestep, shards too short to run
        the GPU at full speed). Measured shares need none of it; the form does."""
        return CostModel(
            self._core.with_split_kept(float(k0), float(k1)), unit=self.unit, meta=self.meta
        )

    @property
    def split_kept(self) -> tuple[float, float]:
        """``(k0, k1)`` of ``with_split_kept``; ``(0, 0)`` unless set."""
        return self._core.k0, self._core.k1

    def with_measured(self, kinds) -> CostModel:
        """A copy whose measured kinds are ``kinds`` (replacing the measured kinds this one
        has): a ``{(seq_len, batch): cost}`` mapping, or ``(seq_len, batch, cost)`` triples.
        Keys ``(seq_len, batch, degree)`` (tuples ``(seq_len, batch, degree, cost)``) with a
        degree ``d > 1`` are one rank's share of that micro-batch split ``d`` ways (sequence
        parallelism), timed alone on one GPU, communication not included."""
        if isinstance(kinds, dict):
            kinds = [(*key, c) for key, c in kinds.items()]
        rows = []
        for kind in kinds:
            s, b, d, c = kind if len(kind) == 4 else (kind[0], kind[1], 1, kind[2])
            rows.append((int(s), int(b), float(c), int(d)))
        return CostModel(self._core.with_measured(rows), unit=self.unit, meta=self.meta)

    @property
    def measured(self) -> dict[tuple[int, int], float]:
        """``{(seq_len, batch): cost}`` of the measured whole micro-batches."""
        return {(s, b): c for s, b, c, d in self._core.measured() if d == 1}

    @property
    def measured_shares(self) -> dict[tuple[int, int, int], float]:
        """``{(seq_len, batch, degree): cost}`` of the measured shares (degree > 1)."""
        return {(s, b, d): c for s, b, c, d in self._core.measured() if d > 1}

    def fitted(self) -> CostModel:
        """This model without its measured kinds (the fitted form only)."""
        return CostModel(self._core.with_measured([]), unit=self.unit, meta=self.meta)

    # -- evaluation ---------------------------------------------------------------------
    @property
    def overhead(self) -> float:
        """The fixed cost of a micro-batch (c0)."""
        return 0.0 if self._core.is_power else self._core.c0

    def sample_cost(self, seq_lens):
        """f(S) of the fitted form, vectorized (what one sample adds; the floor and the
        measured kinds are not in it)."""
        s = np.asarray(seq_lens, dtype=np.float64)
        c = self._core
        return c.coef * s**c.p if c.is_power else c.cs + c.c1 * s + c.c2 * s * s

    def batch_cost(self, seq_lens) -> float:
        """The cost of one micro-batch of samples with these token counts."""
        lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
        return float(self._core.batch_costs(lens, np.array([0, len(lens)], np.int64))[0])

    def batch_costs(self, seq_lens, offsets, *, fitted_only: bool = False) -> np.ndarray:
        """The cost of each micro-batch ``seq_lens[offsets[i]:offsets[i + 1]]``, vectorized;
        ``fitted_only`` ignores the measured kinds."""
        return self._core.batch_costs(
            np.asarray(seq_lens, dtype=np.int64), np.asarray(offsets, dtype=np.int64), fitted_only
        )

    def uniform_costs(self, seq_lens, batch_sizes, *, fitted_only: bool = False) -> np.ndarray:
        """The cost of each micro-batch of ``batch_sizes[i]`` samples of ``seq_lens[i]`` tokens
        each, vectorized; ``fitted_only`` ignores the measured kinds."""
        sizes = np.asarray(batch_sizes, dtype=np.int64)
        lens = np.repeat(np.asarray(seq_lens, dtype=np.int64), sizes)
        return self.batch_costs(
            lens, np.concatenate([[0], np.cumsum(sizes)]), fitted_only=fitted_only
        )

    def __repr__(self) -> str:
        return f"CostModel.{self._core!r}" + (f" [{self.unit}]" if self.unit else "")


# -- sequence parallelism --------------------------------------------------------------------
#: Communication of a split micro-batch where no bandwidth is given: this share of each rank's
#: split compute (``sequence_parallel_comm=None``).
SEQUENCE_PARALLEL_COMM_FRACTION = 0.10
#: Bytes per second one H200 sends in an intra-node all-to-all, the default of
#: ``ulysses_comm_per_token``: NVLink 4 gives each GPU 450 GB/s per direction (NVIDIA's H200
#: datasheet, 900 GB/s bidirectional); NCCL's all-to-all reaches less than its all-reduce bus
#: bandwidth (460-480 GB/s on 8 x H100 in published nccl-tests runs), and 350e9 is the planning
#: figure until ``adaptiveload calibrate --comm`` measures the machine at hand.
H200_ALL_TO_ALL_BYTES_PER_S = 350e9


def ulysses_comm_per_token(
    hidden: int,
    num_layers: int,
    *,
    bytes_per_s: float = H200_ALL_TO_ALL_BYTES_PER_S,
    element_bytes: int = 2,
    unit_s: float = 1e-3,
    all_to_alls: int = 4,
) -> float:
    """``sequence_parallel_comm`` for Ulysses attention: the cost (in ``unit_s`` seconds, the
    cost model's unit; milliseconds by default) of sending one token through a split
    micro-batch's all-to-alls, forward and backward. ``all_to_alls``: the exchanges of
    ``hidden`` values per token per block, forward: 4 for self-attention (q, k and v go out,
    the output comes back). Wan's cross-attention adds 2 (q out, output back) where it runs on
    head shards, for samples short beside their text
    (``parallel.wan.cross_attention_on_head_shards``); the planner's one figure leaves those
    out: they add about 1.3% to such a share (96 images of 1,560 tokens over 8 H200s, at the
    default bandwidth), and long clips, whose exchanges weigh most, do not make them.

    The planner charges a rank's share ``comm * T * (d - 1) / d**2`` for a micro-batch of T
    tokens over d ranks: each rank holds T / d tokens and sends (d - 1) / d of them.
    """
    for name, v in (("hidden", hidden), ("num_layers", num_layers), ("all_to_alls", all_to_alls)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if not bytes_per_s > 0 or not unit_s > 0:
        raise ValueError("bytes_per_s and unit_s must be > 0")
    return 2.0 * all_to_alls * hidden * element_bytes * num_layers / bytes_per_s / unit_s


#: What a cost model's ``meta`` says of the model and the machine, which a fit of new timings
#: does not change: the architecture (``hidden`` size, attention ``heads``, ``layers`` timed),
#: and the all-to-all rates ``calibrate --comm`` measured. Calibration carries them from its
#: prior (``calibrate._model_of``); the sampler's communication terms read them.
DESCRIBES_MODEL = ("hidden", "heads", "layers", "sequence_parallel_comm", "all_to_all_bytes_per_s")


def architecture_of(config: dict, layers: int) -> dict:
    """The ``meta`` of a model of diffusers ``config`` with ``layers`` blocks: ``hidden``
    (heads x head dim) and ``heads`` where the config names both, and ``layers``."""
    heads, head_dim = config.get("num_attention_heads"), config.get("attention_head_dim")
    out = {"layers": int(layers)}
    if isinstance(heads, int) and isinstance(head_dim, int):
        out |= {"hidden": heads * head_dim, "heads": heads}
    return out


def sequence_parallel_comm_of(cost_model: CostModel) -> float | None:
    """The default ``sequence_parallel_comm`` of a cost model: the one ``calibrate --comm``
    measured and stored in its ``meta`` (``comm.with_comm``); else, for a model in
    milliseconds whose ``meta`` names its ``hidden`` size and ``layers`` (the built-in
    profiles do), Ulysses at ``H200_ALL_TO_ALL_BYTES_PER_S``. None otherwise (the planner then
    adds the flat ``SEQUENCE_PARALLEL_COMM_FRACTION``)."""
    measured = cost_model.meta.get("sequence_parallel_comm")
    if isinstance(measured, (int, float)) and measured >= 0:
        return float(measured)
    hidden, layers = cost_model.meta.get("hidden"), cost_model.meta.get("layers")
    if cost_model.unit != "ms" or not isinstance(hidden, int) or not isinstance(layers, int):
        return None
    return ulysses_comm_per_token(hidden, layers)


def _degrees(max_degree: int) -> list[int]:
    """1, 2, 4, .. ``max_degree``: the degrees of the planner's per-degree lists, in order."""
    return [2**k for k in range(int(max_degree).bit_length())]


def sequence_parallel_comm_scale_of(cost_model: CostModel, max_degree: int) -> list[float]:
    """The planner's factor on ``sequence_parallel_comm`` per degree 1, 2, 4, .. ``max_degree``:
    where a cost model's ``meta`` names the model's attention ``heads`` (the built-in profiles
    and ``calibrate --comm`` do), ``parallel.groups.ring_comm_factor`` of each degree (1 where
    the degree divides the heads; Wan 2.1-1.3B's 12 heads over 8 ranks, Ulysses 4 x ring 2:
    1.43, the ring's keys and values whole per head shard); else none (1 at every degree, the
    cost of Ulysses alone)."""
    heads = cost_model.meta.get("heads")
    if not isinstance(heads, int) or heads < 1:
        return []
    from adaptiveload.parallel.groups import ring_comm_factor

    return [ring_comm_factor(d, heads) for d in _degrees(max_degree)]


# Bytes of one key or value element: the blocks run in bf16 (autocast) wherever AdaptiveLoad
# trains or calibrates them.
KV_ELEMENT_BYTES = 2


def sequence_parallel_held_bytes_of(cost_model: CostModel, max_degree: int) -> list[float]:
    """The memory a member of a split micro-batch holds beyond its share, per degree 1, 2, 4,
    .. ``max_degree``: bytes per token of the micro-batch per block that keeps its activations
    (``MemoryModel``'s ``held``). Where a degree exceeds what the model's heads take (Ulysses x
    ring), a member keeps the whole samples' keys and values of its head shard for the backward:
    ``2 * hidden * KV_ELEMENT_BYTES * parallel.groups.ring_held_fraction`` (Wan 2.1-1.3B over 8
    ranks: 768 bytes, 23 KB per token over its 30 blocks). Needs ``hidden`` and ``heads`` in
    the cost model's ``meta`` (the built-in profiles and ``calibrate --comm`` name them); else
    none (0 at every degree)."""
    hidden, heads = cost_model.meta.get("hidden"), cost_model.meta.get("heads")
    if not isinstance(hidden, int) or not isinstance(heads, int) or hidden < 1 or heads < 1:
        return []
    from adaptiveload.parallel.groups import ring_held_fraction

    out = [
        2 * hidden * KV_ELEMENT_BYTES * ring_held_fraction(d, heads) for d in _degrees(max_degree)
    ]
    return out if any(out) else []


def sequence_parallel_comm_terms(
    cost_model: CostModel, comm: float | None, max_degree: int
) -> tuple[float | None, list[float]]:
    """What the planner charges a split micro-batch's exchanges: the cost per token (``comm``,
    the sampler's ``sequence_parallel_comm``, else ``sequence_parallel_comm_of`` the cost model;
    None: the flat ``SEQUENCE_PARALLEL_COMM_FRACTION`` instead) and its factor per degree
    (``sequence_parallel_comm_scale_of``; none without a cost per token, which it scales)."""
    if comm is None:
        comm = sequence_parallel_comm_of(cost_model)
    if comm is None:
        return None, []
    return comm, sequence_parallel_comm_scale_of(cost_model, max_degree)
