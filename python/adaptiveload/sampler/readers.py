"""Who draws a sampler's batches, known only through public, documented paths.

- accelerate's prepared loaders announce themselves while they iterate: a ``DataLoaderShard``
  or ``DataLoaderDispatcher`` is ``GradientState().active_dataloader`` from the start of its
  ``__iter__`` until its end. When that loader's ``batch_sampler`` is the sampler, or
  accelerate's ``BatchSamplerShard`` around it, the sampler knows it reads one batch ahead
  and whether it must deal every rank's micro-batches (the shard keeps batch ``j`` on
  process ``j % num_processes``).
- Any other reader (direct iteration, a torch DataLoader, torchdata's StatefulDataLoader) is
  invisible to the sampler. Whether it reads ahead of training is declared by the sampler's
  ``drawn_is_trained``, or made moot by ``sampler.micro_batches(loader)``, which counts the
  batches the loop received.

Nothing here inspects the caller's stack or another library's private attributes. The limit
of that: a prepared loader whose iteration was left unfinished (a ``break``, an error) stays
accelerate's active loader until it is iterated again, so a different reader that starts a
pass over the same sampler before then is taken for that loader."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Reader:
    """Who iterates the current pass: a name for messages, whether it is known to read
    batches ahead of training, and accelerate's ``BatchSamplerShard`` when that deals them."""

    name: str
    reads_ahead: bool
    shard: object | None = None


PLAIN = Reader("a reader the sampler cannot see (direct iteration or a DataLoader)", False)


def _accelerator_running() -> bool:
    """Whether an ``Accelerator`` is initialized in this process (accelerate not imported:
    none is)."""
    if "accelerate" not in sys.modules:
        return False
    from accelerate.state import is_initialized

    return is_initialized()


def accelerate_processes() -> int:
    """The number of processes of this process's ``Accelerator``, or 1 without one."""
    if not _accelerator_running():
        return 1
    from accelerate.state import PartialState

    return PartialState().num_processes


def reader_of(sampler) -> Reader:
    """The reader of a pass that starts now (called from ``sampler.__iter__``): the one whose
    loader draws from ``sampler``, known by identity alone. Raises
    ``RuntimeError`` for accelerate's dispatcher, which would iterate the sampler on process 0
    only and split those batches evenly across processes, losing the other ranks' samples."""
    if not _accelerator_running():
        return PLAIN
    from accelerate.data_loader import BatchSamplerShard, DataLoaderDispatcher
    from accelerate.state import GradientState

    active = GradientState().active_dataloader
    source = getattr(active, "batch_sampler", None)
    if source is not sampler and getattr(source, "batch_sampler", None) is not sampler:
        return PLAIN
    if isinstance(active, DataLoaderDispatcher):
        raise RuntimeError(
            f"{type(sampler).__name__} under accelerate with dispatch_batches=True: accelerate "
            "would iterate it on process 0 only and split those batches evenly across "
            "processes, losing the other ranks' samples. Use "
            "adaptiveload.integrations.accelerate.prepare_data_loader(accelerator, loader) "
            "(or DataLoaderConfiguration(dispatch_batches=False))."
        )
    if isinstance(source, BatchSamplerShard):
        shard = "accelerate's BatchSamplerShard (its loader reads one batch ahead)"
        return Reader(shard, True, source)
    return Reader("an accelerate DataLoader (it reads one batch ahead)", True)


def check_source(loader, sampler) -> None:
    """``sampler.micro_batches(loader)`` labels the loader's batches with the sampler's plan:
    a loader whose ``batch_sampler`` is another one is refused (accelerate's prepared loaders
    hold the sampler as theirs, inside their ``BatchSamplerShard``, or as
    ``adaptive_sampler``)."""
    source = getattr(loader, "batch_sampler", None)
    ours = (
        source,
        getattr(source, "batch_sampler", None),
        getattr(loader, "adaptive_sampler", None),
    )
    if source is not None and not any(s is sampler for s in ours):
        raise ValueError(
            f"micro_batches(loader): the loader's batch_sampler is not this sampler "
            f"({type(source).__name__}); its batches would not follow this plan's steps"
        )


def check_shard(cursor, shard) -> None:
    """accelerate's shard must deal to the ranks of the ``cursor`` (a sampler's ``Cursor``),
    whole batches each."""
    o = cursor.options
    if shard.split_batches or (shard.num_processes, shard.process_index) != (
        o.num_replicas,
        o.rank,
    ):
        raise RuntimeError(
            f"{cursor.owner} (rank {o.rank} of {o.num_replicas}) is "
            f"sharded by accelerate as process {shard.process_index} of {shard.num_processes}"
            f"{' with split_batches' if shard.split_batches else ''}: the two must agree. "
            "Use adaptiveload.integrations.accelerate.prepare_data_loader(accelerator, loader)."
        )


def check_unsharded(cursor, reader: Reader, sharding: bool | None) -> None:
    """Under an ``Accelerator`` of several processes, ``len(sampler)`` counts every rank's
    micro-batches (what accelerate's shard deals from), so a pass must be dealt by that
    shard unless the sampler was told otherwise (``sharding``, its ``accelerate_sharding``,
    False: ``prepare_data_loader`` sets it), and a sampler told so must not be dealt by it."""
    if reader.shard is not None:
        if sharding is False:
            raise RuntimeError(
                f"{cursor.owner} has accelerate_sharding = False (each rank draws its "
                "own micro-batches, and len() counts only those), but accelerate's "
                "BatchSamplerShard draws it: accelerator.prepare wrapped its DataLoader (or the "
                "loader prepare_data_loader was given). Leave accelerate_sharding unset for "
                "accelerator.prepare, or iterate the loader prepare_data_loader returned."
            )
        return
    if sharding is False:
        return
    processes = accelerate_processes()
    if processes > 1:
        raise RuntimeError(
            f"{cursor.owner} under an Accelerator of {processes} processes is drawn "
            f"by {reader.name}, not by a loader accelerate prepared: its length counts every "
            "rank's micro-batches, which accelerate's BatchSamplerShard deals out. Prepare the "
            "DataLoader (accelerator.prepare(loader), or adaptiveload.integrations.accelerate."
            "prepare_data_loader(accelerator, loader) for exact resumption), or set "
            "sampler.accelerate_sharding = False to draw this rank's micro-batches yourself."
        )


def unknown_position(reader: Reader, handed: int) -> ValueError:
    """The refusal of a ``state_dict()`` without a position the sampler knows to be exact;
    ``handed``: the micro-batches it has handed out this pass."""
    why = (
        f"{reader.name} reads ahead of training"
        if reader.reads_ahead
        else f"it is drawn by {reader.name}, and DataLoader workers read ahead"
    )
    return ValueError(
        f"state_dict(): the {handed} micro-batches this sampler has handed out this pass may "
        f"include some training has not used: {why}. Pass the steps your loop completed, "
        "state_dict(steps_done=N); or draw through sampler.micro_batches(loader), which "
        "counts what the loop received; or, when nothing reads ahead (direct iteration, a "
        "DataLoader without workers, torchdata's StatefulDataLoader), make the sampler with "
        "drawn_is_trained=True. With accelerate: "
        "adaptiveload.integrations.accelerate.prepare_data_loader."
    )
