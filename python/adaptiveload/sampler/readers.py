"""Who draws the batches: whether ``iter(sampler)`` was called by a DataLoader with workers
or by accelerate (both read ahead of training, so a position-less ``state_dict()`` would
count batches training has not used), and accelerate's ``BatchSamplerShard`` (which keeps
batch ``j`` on process ``j % num_processes``, so it must be served every rank's batches).

Known by the calling frame: a plain ``accelerator.prepare(loader)`` gives the sampler no
other sign that it is being sharded, and a wrong guess loses samples."""

from __future__ import annotations

from dataclasses import dataclass


def is_accelerate(obj, qualname: str) -> bool:
    """Whether ``obj`` is an instance of accelerate's class ``qualname``."""
    kind = type(obj)
    return kind.__module__.startswith("accelerate.") and kind.__qualname__ == qualname


@dataclass
class Consumer:
    """Who called ``iter(sampler)``: a name for messages, whether it reads batches ahead of
    the training loop, and accelerate's ``BatchSamplerShard`` when that is the caller."""

    name: str
    reads_ahead: bool
    shard: object | None = None

    @staticmethod
    def of(frame) -> Consumer:
        caller = frame.f_locals.get("self") if frame is not None else None
        if is_accelerate(caller, "BatchSamplerShard"):
            return Consumer("accelerate's BatchSamplerShard", True, caller)
        # accelerate wrappers further up the stack (device placement reads one batch ahead;
        # the dispatcher iterates on process 0 only and splits batches evenly).
        up = frame
        for _ in range(12):
            if up is None:
                break
            obj = up.f_locals.get("self")
            if is_accelerate(obj, "DataLoaderDispatcher"):
                raise RuntimeError(
                    "AdaptiveBatchSampler under accelerate with dispatch_batches=True: accelerate "
                    "would iterate it on process 0 only and split those batches evenly across "
                    "processes, losing the other ranks' samples. Use "
                    "adaptiveload.integrations.accelerate.prepare_data_loader(accelerator, loader) "
                    "(or DataLoaderConfiguration(dispatch_batches=False))."
                )
            if type(obj).__module__.startswith("accelerate."):
                return Consumer("an accelerate DataLoader (it reads one batch ahead)", True)
            up = up.f_back
        workers = getattr(caller, "_num_workers", None)
        module = type(caller).__module__
        if workers is not None and module.startswith(("torch.utils.data", "torchdata.")):
            if workers > 0:
                prefetch = getattr(caller, "_prefetch_factor", 2) or 2
                return Consumer(
                    f"a DataLoader with {workers} workers (it prefetches up to "
                    f"{prefetch * workers} batches)",
                    True,
                )
            return Consumer("a DataLoader without workers", False)
        return Consumer("direct iteration", False)


def called_by_torchdata(frame) -> bool:
    """torchdata's StatefulDataLoader snapshots ``state_dict()`` exactly when the sampler
    has handed out as many batches as the loader will have yielded at that snapshot."""
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name.startswith("torchdata.stateful_dataloader")
