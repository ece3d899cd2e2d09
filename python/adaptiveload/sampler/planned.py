"""``PlannedBatchSampler``: a sampler whose plan source is the whole epoch at once
(``sources.WholeEpoch``), the base of ``AdaptiveBatchSampler`` and ``EqualTokenBatchSampler``.
Beside the pass machinery of ``BatchSampler`` (base.py) it holds the C++ sample table and
planner, memory policies, and online refinement, a ``Refinement`` (refine.py)."""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import torch.distributed as dist

from adaptiveload import _sampler
from adaptiveload.cost import SEQUENCE_PARALLEL_COMM_FRACTION as SP_COMM_FRACTION
from adaptiveload.cost import (
    CostModel,
    sequence_parallel_comm_terms,
    sequence_parallel_held_bytes_of,
)
from adaptiveload.keys import as_group_ids, to_numpy
from adaptiveload.memory import GIB, CheckpointPolicy, held_lengths
from adaptiveload.sampler import resume
from adaptiveload.sampler.base import BatchSampler, Setting
from adaptiveload.sampler.checks import (
    as_seq_lens,
    bool_arg,
    check_options,
    int_arg,
    positive_number,
)
from adaptiveload.sampler.plan import Plan
from adaptiveload.sampler.ranks import distributed_defaults
from adaptiveload.sampler.refine import MAX_KIND_BATCH, MAX_KIND_LEN, Refinement
from adaptiveload.sampler.sources import WholeEpoch


class PlannedBatchSampler(BatchSampler):
    """A whole epoch planned at once, for all ranks: validation, per-epoch planning, memory
    policies and refinement. The two samplers differ in their planner settings and their
    compute cap (``_compute_max_cost``)."""

    memory_model = Setting()
    memory_budget_gib = Setting()
    sequence_parallel = Setting()
    sequence_parallel_comm = Setting()

    def __init__(
        self, seq_lens, max_tokens, *, group_keys, process_group, drawn_is_trained, **settings
    ):
        self.seq_lens = as_seq_lens(seq_lens)
        settings["drawn_is_trained"] = bool_arg("drawn_is_trained", drawn_is_trained)
        settings["num_replicas"], settings["rank"] = distributed_defaults(
            settings["num_replicas"], settings["rank"], process_group
        )
        self.options = check_options(max_tokens, **settings)
        name = type(self).__name__
        self.cost_model = self.options.cost_model  # the current epoch's: base + learned kinds
        self._refinement = Refinement(self.options.cost_model, self.options.max_cost, name)
        # None: the sequence length is the key (the C++ table numbers lengths in sorted order,
        # as these ids are numbered).
        self._group_ids = None if group_keys is None else as_group_ids(group_keys, self.seq_lens)
        h = hashlib.blake2b(digest_size=16)
        h.update(self.seq_lens.tobytes())
        h.update(b"by length" if self._group_ids is None else self._group_ids.tobytes())
        self._data_digest = h.hexdigest()
        self._build_table()
        self._refuse_oversize()
        self._warned_skips = False
        self._start_cursor(WholeEpoch(self._make_plan, self._data_digest, len(self.seq_lens)))

    @property
    def group_keys(self) -> np.ndarray | None:
        """The group of each sample as dense int64 ids in sorted key order (None: grouped by
        sequence length)."""
        return self._group_ids

    # -- construction helpers, also used after unpickling ---------------------------------
    def _build_table(self) -> None:
        """The C++ sample table of ``self.cost_model``, and the compute cap it gives."""
        memory = ()
        if self.memory_model is not None:
            memory = (self.memory_model.native, self.memory_budget_gib * GIB, self._memory_held)
        self._table = _sampler.SampleTable(
            self.seq_lens, self._group_ids, self.cost_model.native, *memory
        )
        self._max_cost = self._compute_max_cost()

    @property
    def _memory_held(self) -> list[float]:
        """What a member of a split micro-batch holds beyond its share, per degree (the
        ring's keys and values: ``cost.sequence_parallel_held_bytes_of`` the base cost model);
        none without a memory model."""
        if self.memory_model is None:
            return []
        return sequence_parallel_held_bytes_of(self.options.cost_model, self.sequence_parallel)

    def _compute_max_cost(self) -> float:
        raise NotImplementedError

    def _refuse_oversize(self) -> None:
        if self.on_oversize != "error":
            return
        over = self._table.oversize_samples(self.max_tokens, self._max_cost, self.sequence_parallel)
        if len(over) == 0:
            return
        i = int(over[0])
        cost = float(self._table.batch_cost(np.array([i], np.int64)))
        cap = f"max_tokens = {self.max_tokens}"
        if self.sequence_parallel > 1:
            cap += f" on each of sequence_parallel = {self.sequence_parallel} ranks"
        # What one rank holds of it: all of it, or split, its largest share.
        sample, D = [self.seq_lens[i]], self.sequence_parallel
        held = held_lengths(sample, D)
        memory, budget = self.memory_model, self.memory_budget_gib
        if (
            memory is not None
            and memory.share_blocks(sample, D, budget * GIB, self._memory_held) < 0
        ):
            peak = memory.share_peak_bytes(sample, D, memory.num_blocks, self._memory_held)
            margin = self.memory_model.margin
            share = f"a share of {int(held[0])} tokens on each of {self.sequence_parallel} ranks: "
            cap = (
                f"the memory budget of {self.memory_budget_gib:g} GiB ("
                f"{share if self.sequence_parallel > 1 else ''}predicted peak with every "
                f"block checkpointed {peak / GIB:.2f} GiB, {peak * (1 + margin) / GIB:.2f} GiB "
                f"with the margin of {margin:g})"
            )
        elif self.seq_lens[i] <= self.max_tokens:
            cap = f"max_cost = {self._max_cost:.6g} (its predicted cost {cost:.6g})"
        raise ValueError(
            f"{type(self).__name__}: {len(over)} sample(s) exceed a cap on their own, the first "
            f"at index {i} with {int(self.seq_lens[i])} tokens, over {cap}: raise the cap, or "
            f"leave such samples out with on_oversize='skip'"
        )

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_table"]  # made again from the cost model
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._build_table()

    # -- planning -----------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        """Everything that shapes a plan, except the epoch and the position in it."""
        return resume.fingerprint(
            type(self).__name__,
            self.options,
            len(self.seq_lens),
            self._data_digest,
            self.cost_model,
            self._max_cost,
        )

    def _make_plan(self, epoch: int, excluded: np.ndarray | None) -> Plan:
        """Epoch ``epoch``'s plan without the samples ``excluded`` (a warning, once, for
        samples skipped as oversize)."""
        s, p = self.options, _sampler.PlanOptions()
        p.max_tokens, p.max_batch_size = s.max_tokens, s.max_batch_size or 0
        p.max_cost, p.num_replicas = float(self._max_cost), s.num_replicas
        p.micro_batches_per_step, p.shuffle = s.micro_batches_per_step, s.shuffle
        p.seed, p.epoch, p.drop_last, p.balance = s.seed, epoch, s.drop_last, s.balance
        p.lookahead_steps, p.uneven_counts = s.lookahead_steps, s.uneven_counts
        p.mix_tolerance, p.skip_oversize = s.mix_tolerance, s.on_oversize == "skip"
        p.representative = s.balance and s.composition == "representative"
        if s.sequence_parallel > 1:
            p.sequence_parallel = s.sequence_parallel
            comm, scale = sequence_parallel_comm_terms(
                self.options.cost_model, s.sequence_parallel_comm, s.sequence_parallel
            )
            p.sequence_parallel_comm_per_token = 0.0 if comm is None else comm
            p.sequence_parallel_comm_scale = scale
            p.sequence_parallel_comm_fraction = 0.0 if comm is not None else SP_COMM_FRACTION
        raw = _sampler.plan_epoch(
            self._table, p, None if excluded is None else excluded.view(np.uint8)
        )
        raw = {k: (int(v) if isinstance(v, int) else v) for k, v in raw.items()}
        plan = Plan(max_tokens=s.max_tokens, max_cost=self._reported_max_cost(), **raw)
        if len(plan.skipped) and not self._warned_skips:
            self._warned_skips = True
            warnings.warn(
                f"{type(self).__name__}: skipped {len(plan.skipped)} sample(s) that alone "
                f"exceed a cap (first: index {int(plan.skipped[0])}, "
                f"{int(self.seq_lens[plan.skipped[0]])} tokens)",
                stacklevel=4,  # the caller of the sampler's method, through Cursor.plan
            )
        return plan

    def _reported_max_cost(self) -> float | None:
        return self._max_cost

    def _before_pass(self) -> None:
        self.plan()  # a plan that cannot be made fails here, before the ranks' check

    def plan(self) -> Plan:
        """The whole current epoch for all ranks (cached until ``set_epoch`` or a resume)."""
        return self._cursor.plan()

    # -- memory policy ------------------------------------------------------------------
    def _indices(self, indices, what: str) -> np.ndarray:
        """``indices`` as int64 dataset indices: non-empty, 1-D, integers in range."""
        idx = to_numpy(indices, "indices")
        if idx.ndim != 1 or idx.size == 0 or idx.dtype.kind not in "iu":
            raise ValueError(
                f"{what}: indices must be a non-empty 1-D sequence of integer dataset indices, "
                f"got {indices!r}"
            )
        n = len(self.seq_lens)
        if idx.min() < 0 or idx.max() >= n:
            raise ValueError(f"{what}: indices must be in [0, {n}), got {indices!r}")
        return idx.astype(np.int64)

    def checkpointed_blocks(self, indices, degree: int = 1) -> int:
        """Blocks to run with activation checkpointing for this micro-batch (the plan's
        choice; needs a memory model), or with ``degree`` > 1 for one rank's share of it
        (``mb.degree``). Depends only on the samples' count and tokens, so
        ``memory_policy().blocks_for(seq_lens, degree)`` gives the same where only lengths are
        known. Samples that do not fit the budget even with every block checkpointed (no plan
        holds them together) raise ``ValueError``."""
        if self.memory_model is None:
            raise ValueError("checkpointed_blocks needs a sampler made with memory_model")
        idx = self._indices(indices, "checkpointed_blocks")
        d = self.sequence_parallel
        if degree not in {2**k for k in range(d.bit_length())}:
            raise ValueError(
                f"checkpointed_blocks: degree must be a power of two <= sequence_parallel = {d} "
                f"(the plan's mb.degree), got {degree!r}"
            )
        lens, memory = self.seq_lens[idx], self.memory_model
        held = held_lengths(lens, degree)
        if degree == 1:
            blocks = int(self._table.checkpointed_blocks(idx))
        else:
            blocks = memory.share_blocks(
                lens, degree, self.memory_budget_gib * GIB, self._memory_held
            )
        if blocks < 0:
            peak = memory.share_peak_bytes(lens, degree, memory.num_blocks, self._memory_held)
            share = f", a share of {degree}" if degree > 1 else ""
            hint = (
                "; split, pass the plan's degree (mb.degree)"
                if degree < d
                else ": no plan holds such a micro-batch"
            )
            raise ValueError(
                f"checkpointed_blocks: these {idx.size} sample(s) ({int(held.sum())} tokens"
                f"{share}) do not fit the memory budget of {self.memory_budget_gib:g} GiB even "
                f"with every block checkpointed (predicted peak {peak / GIB:.3g} GiB, "
                f"{peak * (1 + self.memory_model.margin) / GIB:.3g} GiB with the margin){hint}"
            )
        return blocks

    def memory_policy(self, log=None, reserved_gib: float = 0.0) -> CheckpointPolicy:
        """A ``CheckpointPolicy`` for the training loop: the plan's choice per micro-batch, the
        fallback to full checkpointing after an out-of-memory error, peaks against the budget
        (plus ``reserved_gib``, memory the model's calibration does not hold, such as the
        optimizer state the budget was reduced by)."""
        if self.memory_model is None:
            raise ValueError("memory_policy needs a sampler made with memory_model")
        return CheckpointPolicy(
            self.memory_model,
            self.memory_budget_gib,
            reserved_gib=reserved_gib,
            log=log,
            held_per_token=self._memory_held,
        )

    # -- online refinement (refine.py) --------------------------------------------------
    @property
    def base_cost_model(self) -> CostModel:
        """The cost model this sampler was made with (``options.cost_model``); ``cost_model``
        is it with the learned kinds of the current epoch."""
        return self.options.cost_model

    def record_time(self, indices, ms: float, degree: int | None = None) -> bool:
        """Record the measured forward+backward time of one micro-batch this rank trained.

        Args:
            indices: the micro-batch as the sampler yielded it (list, array or tensor of
                dataset indices).
            ms: its time in milliseconds, a finite number > 0.
            degree: with ``sequence_parallel`` > 1, the degree it ran at
                (``MicroBatch.degree``), required there: a share of a split micro-batch is
                not learned (False), so that it never stands for the whole one; the shares
                are priced by the cost model's measured shares (``calibrate
                --sequence-parallel``).

        Returns True when recorded: its kind is ``(seq_len, batch)`` when all its samples
        have ``seq_len`` tokens; a micro-batch of mixed lengths has no kind and is not
        recorded (False). No communication: ``update_cost_model`` folds the records.
        """
        if not positive_number(ms):
            raise ValueError(
                f"record_time: ms must be a finite number > 0 (milliseconds), got {ms!r}"
            )
        top = self.options.sequence_parallel
        if (degree is None and top > 1) or (
            degree is not None and (degree not in [2**k for k in range(11)] or degree > top)
        ):
            raise ValueError(
                f"record_time: degree must be the degree the micro-batch ran at "
                f"(MicroBatch.degree: a power of two <= sequence_parallel = {top}), got {degree!r}"
            )
        if top > 1 and degree > 1:
            return False
        idx = self._indices(indices, "record_time")
        lens = self.seq_lens[idx]
        seq_len = int(lens[0])
        if (lens != seq_len).any() or seq_len > MAX_KIND_LEN or idx.size > MAX_KIND_BATCH:
            return False
        if self.memory_model is not None:
            # The cost model describes fully checkpointed micro-batches; this one ran with the
            # policy's blocks, so it is recorded as what it would have taken with all of them.
            n = int(self._table.checkpointed_blocks(idx))
            if n >= 0:
                ms = float(ms) / self.memory_model.time_factor(n)
        self._refinement.record((seq_len, idx.size), ms)
        return True

    def update_cost_model(self, process_group=None) -> dict:
        """Fold the times recorded since the last update into the cost model of the next
        epoch.

        A collective when ``torch.distributed`` is initialized with more than one process:
        every rank must call it, at the same point (e.g. at each epoch's end), or the others
        wait for it (until the process group's timeout). The ranks' records are all-gathered
        (one ``all_gather_object`` on ``process_group``, default the whole job, which every
        rank that plans with this sampler's settings must be in) and folded in rank order,
        so every rank learns the same times. Per ``(seq_len, batch)`` kind the most recent
        32 times are kept; the kind's cost is their median (the lower middle one of an even
        count, so that of two records a cold first run does not count).

        The new model is the base cost model whose measured kinds are updated by the learned
        ones. It takes effect at the next ``set_epoch`` to another epoch: the current
        epoch's plan never changes. A learned single-sample kind above a given ``max_cost``
        is held back (with a warning), so that refinement never changes which samples an
        epoch holds.

        Returns ``{"records": records folded (all ranks), "kinds": kinds learned, "new_kinds":
        kinds learned for the first time, "measured_over_fitted": median over the learned
        kinds of learned / fitted cost (None without kinds)}``.
        """
        initialized = dist.is_available() and dist.is_initialized()
        if process_group is not None and not initialized:
            raise ValueError(
                "update_cost_model: process_group given but torch.distributed is not initialized"
            )
        distributed = initialized and dist.get_world_size(process_group) > 1
        return self._refinement.update(process_group, distributed)

    def _use_active_model(self) -> None:
        """Plan with the refinement's cost model of the current epoch."""
        model = self._refinement.active_model()
        if model.to_dict() != self.cost_model.to_dict():
            self.cost_model = model
            self._build_table()

    def micro_batches_in_step(self, step: int) -> int:
        """Micro-batches this rank draws in ``step`` of the current plan: K, or with
        ``uneven_counts`` any count >= 1. Every rank knows its own from the plan, without
        communication; the loop synchronizes gradients at the last of them."""
        plan = self.plan()
        step = int_arg("step", step, 0)
        if step >= plan.num_steps:
            raise ValueError(f"step must be in [0, {plan.num_steps}) for this plan, got {step}")
        return plan.micro_batches_in_step(step, self.rank)

    def _on_new_epoch(self) -> None:
        # Another epoch plans with the times learned by update_cost_model so far.
        if self._refinement.next_epoch():
            self._use_active_model()

    # -- resumption (cursor.py, sources.py, resume.py, refine.py) ---------------------------
    def state_dict(
        self, steps_done: int | None = None, *, micro_batches_done: int | None = None
    ) -> dict:
        """``BatchSampler.state_dict``; with times learned by ``update_cost_model``, the state
        also holds them under ``'learned_costs'``: ``{"active": [[seq_len, batch, ms], ...]``
        (the current epoch's), ``"history": [[seq_len, batch, [ms, ...]], ...]}`` (the most
        recent times per kind, which give the next epoch's)."""
        state = super().state_dict(steps_done, micro_batches_done=micro_batches_done)
        learned = self._refinement.state_dict()
        if learned is not None:
            state["learned_costs"] = learned
        return state

    def load_state_dict(self, state: dict) -> None:
        """``BatchSampler.load_state_dict``. The state's learned times (``update_cost_model``)
        are restored first: those of its epoch, so that a sampler made anew with the same base
        cost model replays the plan, and those for the next epoch. A state without them (key
        ``'learned_costs'``, as before online refinement) learned nothing. Records not folded
        by an update when the state was made are not in it, and those of this sampler are
        dropped."""
        if not isinstance(state, dict):
            raise ValueError(f"sampler state must be a dict, got {type(state).__name__}")
        before = (self.cost_model, self._table, self._max_cost, self._refinement.snapshot())
        try:
            # The learned times first: the fingerprint holds the cost model they make.
            self._refinement.load_state_dict(state.get("learned_costs"))
            self._use_active_model()
            super().load_state_dict(state)
        except Exception:  # the sampler stays as it was
            self.cost_model, self._table, self._max_cost, snapshot = before
            self._refinement.restore(snapshot)
            raise
