"""The two samplers, thin fronts over ``PlannedBatchSampler``: ``AdaptiveBatchSampler``
(dual caps, rank balancing, representative steps) and ``EqualTokenBatchSampler`` (the
equal-token bucket baseline)."""

from __future__ import annotations

from adaptiveload.cost import CostModel
from adaptiveload.memory import MemoryModel
from adaptiveload.sampler.defaults import MIX_TOLERANCE, resolve_composition
from adaptiveload.sampler.planned import PlannedBatchSampler

__all__ = ["MIX_TOLERANCE", "AdaptiveBatchSampler", "EqualTokenBatchSampler"]

# A compute cap that never binds (equal-token buckets have none).
_NO_COST_CAP = 1e300


class AdaptiveBatchSampler(PlannedBatchSampler):
    """Dual-constraint, rank-balanced batch sampler.

    Each micro-batch obeys ``sum_i S_i <= max_tokens`` (memory, M_mem) and
    ``cost_model(batch) <= max_cost`` (compute, M_comp) and never mixes ``group_keys``.
    Each optimizer step's ``W x K`` micro-batches come from a window of
    ``lookahead_steps`` steps, arranged so that every step is at least as representative of the
    window's data as a shuffle's (``composition``), and are assigned to ranks (K each) by
    longest-processing-time first.

    Args:
        seq_lens: 1-D integer token counts, one per dataset index (list, numpy array or
            tensor of any dtype).
        max_tokens: memory cap, tokens per micro-batch.
        max_cost: compute cap in the cost model's unit. Default (None):
            ``max(cost of the heaviest sample alone, min over groups of the cost of a
            micro-batch of that group filled to max_tokens)``: every sample fits, the
            cheapest group is never cut below what memory allows, and heavier groups are
            cut to about that cost, which is what lets steps balance.
        cost_model: a ``CostModel``; default ``CostModel.default()`` (Wan 2.1 14B, H200).
        group_keys: optional per-sample keys (e.g. ``(frames, h, w)`` rows, tuples or ints,
            in a list, array or tensor); a micro-batch never mixes keys (``1`` and ``'1'`` are
            two). Default: the sequence length.
        num_replicas, rank: data-parallel ranks and this rank. Default: from
            ``process_group`` (the data-parallel group; every rank of a sequence-parallel
            group then draws the same batches), else from ``torch.distributed`` when
            initialized, else 1, 0.
        micro_batches_per_step: K, micro-batches per rank per optimizer step.
        shuffle, seed: deterministic shuffling from ``(seed, epoch)``; no global RNG. The
            seed must be the same on every rank.
        drop_last: drop the micro-batches that do not fill the last step (reported in the
            plan) instead of halving the largest micro-batches to fill it (and repeating
            samples only if nothing can be halved).
        lookahead_steps: how far the order departs from a plain shuffle: micro-batches are
            regrouped within windows of this many optimizer steps. 1 keeps the shuffled
            step order; larger windows balance better.
        composition: how each window's micro-batches form its steps. ``"representative"``
            (the default): of the window's arrangements (cost strata dealt round-robin by
            group, from the whole window mixed to steps of similar cost), the best balanced
            whose steps are as close to the window's mix of groups as uniform shuffles of the
            same micro-batches (by tokens, by samples, and in steps missing a group): the model
            trains on the mix a shuffle gives it. ``"balanced"``: speed over fidelity, steps
            mix only as far as ``mix_tolerance`` allows, else hold one or two shapes (which
            changes what each optimizer step learns from; docs/sampler.md, "Representative
            steps"). Default (None): "representative", or "balanced" where ``mix_tolerance``
            is given.
        mix_tolerance: with ``composition="balanced"``, the predicted imbalance (mean over a
            window's steps of 1 - mean/max rank cost) that steps may take on to mix: each
            window's steps are drawn from the fewest cost strata (1: the whole window, every
            step a proportional draw of its groups) that keep it within this; none does:
            steps of similar cost. 0 gives the best balance; 1 mixes every window whatever
            the balance. ``plan().window_strata`` and ``step_composition`` report where each
            plan landed. With sequence parallelism it bounds the rank time lost to waiting
            and to what splitting adds. Default (None): ``MIX_TOLERANCE`` (0.02), except
            where ``MIX_TOLERANCE_BY_SETUP`` names the setup (sampler/defaults.py).
        balance: False gives the paper's form: dual caps, no cross-rank balancing.
        max_batch_size: at most this many samples per micro-batch (None: no limit beyond the
            caps). ``max_batch_size=1`` is the batch-size-1 pipeline (DiffSynth-Studio's
            trainer, one sample per micro-batch): steps of ``W x K`` single samples, still
            balanced across ranks.
        memory_model, memory_budget_gib: a ``MemoryModel`` and the budget (GiB) each
            micro-batch's predicted peak must stay within: micro-batches are packed under the
            budget, each checkpoints the fewest blocks that keep it there
            (``plan().checkpointed``, ``checkpointed_blocks(indices)``, ``memory_policy()``),
            and its cost is the cost model's (fully checkpointed) times the time it saves.
            A micro-batch of two or more samples grows only while it needs no
            recomputation (only a sample alone checkpoints), the default ``max_cost`` is
            then one that never binds sooner (the heaviest group's micro-batch filled that
            way), and a sample over ``max_cost`` runs alone.
            ``max_tokens`` may then be None (the most tokens one sample fits at full
            checkpointing). With ``sequence_parallel``, each listing's blocks are those of
            its rank's share. docs/memory.md.
        on_oversize: 'error' (default) refuses, when the sampler is made, samples that alone
            break a cap; 'skip' leaves them out with a warning (``plan().skipped``).
        verify_ranks: with ``torch.distributed`` initialized, all ranks compare their plan
            fingerprints at the start of each epoch and raise ``RuntimeError`` naming what
            differs. Every process of the job must then iterate its sampler each epoch.
        uneven_counts: for loops that synchronize gradients once per optimizer step (DDP
            with ``no_sync`` or a manual all-reduce): each step's ``W x K`` micro-batches go
            to ranks in any count >= 1 each (K is the average), so that a rank of several
            cheap micro-batches and one of a single expensive one finish together. The loop
            learns its counts from ``steps()`` / ``micro_batches_in_step(step)``; states go by
            steps. FSDP2 only with parameters kept unsharded within a step
            (``reshard_after_forward=False``), since its all-gathers run per forward:
            docs/sampler.md, "Uneven micro-batch counts per rank".
        drawn_is_trained: declare that nothing reads this sampler's batches ahead of
            training (direct iteration, a DataLoader without workers, torchdata's
            ``StatefulDataLoader``), so that ``state_dict()`` without a position may count
            the micro-batches handed out as trained. Default False: such a ``state_dict()``
            inside a pass is refused unless ``micro_batches(loader)`` counted the loop's
            batches (docs/sampler.md, "Resuming").
        sequence_parallel: the largest sequence-parallel degree D (1: off; a power of two
            dividing num_replicas; any degree runs over any head count, as Ulysses x ring,
            ``parallel.layout``); "auto": the largest such D up to 8, one node's GPUs
            (``sampler.checks.auto_sequence_parallel``). Each
            step's micro-batches then get a degree d in {1, 2, ..., D} and a group of d ranks
            that process it together, each on 1/d of every sample's tokens, chosen so that
            the step's slowest rank finishes soonest; ``max_tokens`` bounds each rank's share,
            so a clip longer than one GPU holds runs split. The num_replicas ranks are all the
            job's GPUs. Needs ``uneven_counts=True``. ``MicroBatch.degree`` / ``.member`` /
            ``.group_ranks`` tell the loop; docs/sampler.md, "Sequence parallelism per
            micro-batch".
        sequence_parallel_comm: what sending one token through a split micro-batch's
            all-to-alls costs, in the cost model's unit (``ulysses_comm_per_token`` computes
            it from the model and the bandwidth). None: ``sequence_parallel_comm_of(cost_model)``
            (the built-in Wan profiles know their size), else a flat
            ``SEQUENCE_PARALLEL_COMM_FRACTION`` (10%) of the split compute.

    ``record_time`` and ``update_cost_model`` refine the cost model with measured times,
    epoch after epoch (docs/sampler.md, "Online refinement").
    """

    def __init__(
        self,
        seq_lens,
        max_tokens: int | None,
        max_cost: float | None = None,
        cost_model: CostModel | None = None,
        group_keys=None,
        num_replicas: int | None = None,
        rank: int | None = None,
        micro_batches_per_step: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        lookahead_steps: int = 64,
        balance: bool = True,
        on_oversize: str = "error",
        process_group=None,
        verify_ranks: bool = True,
        max_batch_size: int | None = None,
        memory_model: MemoryModel | None = None,
        memory_budget_gib: float | None = None,
        uneven_counts: bool = False,
        mix_tolerance: float | None = None,
        drawn_is_trained: bool = False,
        sequence_parallel: int | str = 1,
        sequence_parallel_comm: float | None = None,
        composition: str | None = None,
    ):
        composition, mix_tolerance = resolve_composition(
            composition, mix_tolerance, sequence_parallel, max_batch_size, micro_batches_per_step
        )
        # Every argument as given (composition and mix_tolerance resolved) is a setting of the base: one list,
        # the signature above, instead of a second one here.
        super().__init__(**_arguments(locals()))

    @property
    def max_cost(self) -> float:
        """The compute cap M_comp in use (the default is computed from the data)."""
        return self._max_cost

    def _compute_max_cost(self) -> float:
        if self.options.max_cost is not None:
            return self.options.max_cost
        return float(self._table.default_max_cost(self.max_tokens, self.max_batch_size or 0))


def _arguments(local_names: dict) -> dict:
    """A constructor's arguments from its ``locals()`` taken first thing (or after resolving
    defaults): everything but ``self`` and the ``__class__`` cell that ``super()`` adds."""
    return {k: v for k, v in local_names.items() if k not in ("self", "__class__")}


class EqualTokenBatchSampler(PlannedBatchSampler):
    """The baseline video teams use today: same-key buckets, ``floor(max_tokens / S)``
    samples per micro-batch, micro-batches in random order dealt to ranks round-robin
    (each rank draws independently of the others' cost). Same interface as
    ``AdaptiveBatchSampler``; ``cost_model`` only predicts costs for reports. With
    ``max_batch_size=1`` it is the batch-size-1 pipeline's default: shuffled samples, one per
    micro-batch, dealt to ranks in order."""

    def __init__(
        self,
        seq_lens,
        max_tokens: int,
        group_keys=None,
        num_replicas: int | None = None,
        rank: int | None = None,
        micro_batches_per_step: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        cost_model: CostModel | None = None,
        on_oversize: str = "error",
        process_group=None,
        verify_ranks: bool = True,
        max_batch_size: int | None = None,
        drawn_is_trained: bool = False,
    ):
        # Its arguments as given, and the settings that make it the baseline.
        super().__init__(
            **_arguments(locals()),
            max_cost=None,
            balance=False,
            lookahead_steps=1,
            memory_model=None,
            memory_budget_gib=None,
            uneven_counts=False,
            mix_tolerance=0.0,
            composition="balanced",
        )

    @property
    def max_cost(self) -> None:
        return None

    def _compute_max_cost(self) -> float:
        return _NO_COST_CAP

    def _reported_max_cost(self) -> None:
        return None
