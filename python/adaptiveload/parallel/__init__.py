"""Sequence parallelism chosen per micro-batch: the ranks of a micro-batch's group each run the
model on their share of its tokens (Ulysses attention: all-to-alls turn token shards into head
shards around each self-attention), and the gradients they add up are those of the micro-batch
processed whole on one rank.

Any degree runs over any head count. ``layout(d, heads) -> (u, r)``: Ulysses over
``u = gcd(d, heads)`` ranks times a ring of ``r = d / u`` (Wan 2.1-1.3B's 12 heads over 8
ranks: 4 x 2; a degree dividing the heads: r = 1, Ulysses alone). Member m holds the m-th
piece of each sample's tokens as always and attends for head shard ``m % u``: its queries are
those of the contiguous block its u Ulysses peers (``m - m % u`` onwards) hold, its keys and
values those of the whole sample (the ring's part: an all-gather of K and V, fused with the
Ulysses exchange in one all-to-all over the micro-batch's group). What the ring part costs over
Ulysses alone: each member holds the whole sample's keys and values for ``heads / u`` heads
(with u = 1, all of them) and sends r times the keys' and values' bytes; the compute is the
same. Refused: a degree or head count below 1 (``layout`` raises, naming both).

The sampler (``sequence_parallel=D``) gives each micro-batch a degree d and a group of d ranks
(``MicroBatch.degree``, ``.member``, ``.group_ranks``). Here:

- ``SequenceParallelGroups``: the process groups of every aligned group of d ranks, made once
  by every rank (``torch.distributed.new_group`` is collective), and the group of a micro-batch.
- ``token_share``: the tokens of one sample a member holds (the planner's cut, planner.h: the
  sample in d contiguous pieces, the first ``S % d`` one token longer).
- ``split_sequence(model, group, degree, member)``: a context in which ``model``'s forward runs
  on this member's share, with Ulysses (x ring) attention over ``group``, and gathers the
  output so that the loop computes its loss on the whole micro-batch as usual. The gather's backward keeps this
  member's own tokens' gradient only, so the members' gradients sum (DDP's all-reduce) to the
  gradient of the whole micro-batch, each sample once. Forwards started in the context run
  split (a backward after it recomputes their checkpointed blocks split); forwards started
  after it run whole. Misuse (a member number that is not the rank's place, a group that is
  not of ``degree`` ranks, members running different micro-batches) is refused on every
  member at the first block.

Where things live: ``groups.py`` (shares, ``layout``, groups, ``ONE_DEVICE``),
``collectives.py`` (the exchanges, with autograd), ``members.py`` (the members' check that they
run the same micro-batch), ``token_split.py`` (the state the hooks share, and which forward a
hook serves), ``split.py`` (``split_sequence``, which imports the families by name), and one
module per family: ``wan.py`` (diffusers' Wan), ``diffsynth.py`` (DiffSynth-Studio's Wan),
``ltx_video.py``, ``hunyuan_video.py`` (joint attention: the text is held whole by every member).

Why not diffusers' ``ContextParallelConfig``: it fixes one mesh per model
(``enable_parallelism``), while the degree and the group change from one micro-batch to the
next here; the all-to-alls here take any group, and lengths not divisible by d.
"""

from adaptiveload.parallel.groups import (
    ONE_DEVICE,
    SequenceParallelGroups,
    layout,
    share_sizes,
    token_share,
)
from adaptiveload.parallel.split import SPLITS, is_split_installed, split_sequence

__all__ = [
    "ONE_DEVICE",
    "SPLITS",
    "SequenceParallelGroups",
    "is_split_installed",
    "layout",
    "share_sizes",
    "split_sequence",
    "token_share",
]
