"""``Cursor``: one rank's place in an epoch, the state of a sampler's passes over it, whatever
the sampler's plan source (sources.py: the whole epoch at once, or segments as the loop
reaches them).

Places are ``(step, micro-batches of this rank done in it)`` in the epoch's step numbering; a
step done is ``(step + 1, 0)``. A sampler owns one cursor. It holds the epoch; where the plan
source starts it (``token``: None, the epoch's start; else what a resume left, which only the
source reads) and the place where the next pass starts; of the pass under way, its stage, the
place handed out, the place ``micro_batches(loader)`` received, who reads it (readers.py) and
the segments the loop may still ask for; whether a resumed position waits for its pass; and
the plan the ranks last agreed on. Nothing else changes these, and each change is one of its
transitions:

- ``new_epoch(epoch)``: ``set_epoch`` to another epoch, from its start;
- ``again()``: a new pass over an epoch already done, from its start;
- ``begin(reader)``: a pass starts; ``handed``, ``finish`` and ``received`` follow it
  (iteration.py);
- ``load_state_dict``: a saved position, taken whole or not at all;

and ``state_dict`` is the position a sampler saves."""

from __future__ import annotations

from collections.abc import Iterator

from adaptiveload.sampler.checks import Options
from adaptiveload.sampler.plan import Plan, Segment
from adaptiveload.sampler.ranks import verify_same_plan
from adaptiveload.sampler.readers import PLAIN, Reader, unknown_position

READY, RUNNING, DONE = "ready", "running", "done"
START = (0, 0)


class Cursor:
    """One rank's place in an epoch.

    Args:
        owner: the sampler's name, for messages.
        options: the sampler's settings (rank, K, uneven counts, ``drawn_is_trained``).
        source: the sampler's plan source (``sources.WholeEpoch`` or ``stream.Streamed``).
    """

    def __init__(self, owner: str, options: Options, source):
        self.owner = owner
        self.options = options
        self.source = source
        self.new_epoch(0)
        #: the place ``micro_batches(loader)`` received (None: no such loop in this pass)
        self.trained: tuple[int, int] | None = None
        #: who reads the pass under way
        self.reader: Reader = PLAIN
        #: ``micro_batches(loader)`` counts what the loop receives (set before the loader
        #: starts drawing)
        self.counting = False
        #: the fingerprint, epoch and resume point the ranks last agreed on
        self.verified: tuple | None = None

    def __getstate__(self) -> dict:
        # A copy plans anew and knows no reader (both belong to this process).
        return self.__dict__ | {"cached_plan": None, "kept": [], "reader": PLAIN}

    # -- transitions ----------------------------------------------------------------------
    def new_epoch(self, epoch: int) -> None:
        """Epoch ``epoch``, from its start, no pass begun."""
        self.epoch = epoch
        self.again()
        #: READY (no pass begun), RUNNING or DONE
        self.stage = READY
        #: the place handed out in the pass under way
        self.position = START
        #: a resumed position whose epoch ``set_epoch`` must not leave before its pass
        self.resume_pending = False

    def again(self) -> None:
        """The whole epoch again, after a pass that ended (resumed or not)."""
        #: where the plan source starts the epoch (None: its start), read by the source only
        self.token = None
        #: the place where the next pass starts
        self.start = START
        self.cached_plan: Plan | None = None
        #: the segments of the pass under way that the loop may still ask for
        self.kept: list[Segment] = []

    def begin(self, reader: Reader) -> None:
        """A pass starts at ``start``, read by ``reader``."""
        self.reader = reader
        # Under micro_batches(loader) the loop has received nothing of the pass yet.
        self.trained = self.start if self.counting else None
        self.resume_pending = False
        self.stage = RUNNING
        self.position = self.start
        #: micro-batches handed out in the pass under way
        self.count = 0
        self.kept = []

    def handed(self, place: tuple[int, int], last: bool = False) -> None:
        """Micro-batches handed out up to ``place``; ``last``: the rank's last of the epoch."""
        self.position = place
        self.count += 1
        if last:
            self.stage = DONE

    def finish(self) -> None:
        self.stage = DONE

    def received(self, place: tuple[int, int]) -> None:
        """``micro_batches(loader)`` has received the micro-batches up to ``place``."""
        self.trained = place

    # -- what it knows ----------------------------------------------------------------------
    def plan(self) -> Plan:
        """The epoch's plan for all ranks (made on first use), where the source plans the whole
        epoch at once."""
        if self.cached_plan is None:
            self.cached_plan = self.source.whole_plan(self)
        return self.cached_plan

    def segments(self) -> Iterator[Segment]:
        """The pass's segments from its start, each kept while the loop may still ask for it:
        from the one of the step last received (or handed out), and the last two at least."""
        for seg in self.source.segments(self):
            self.kept.append(seg)
            floor = (self.trained or self.position)[0]
            while len(self.kept) > 2 and self.kept[0].steps_end < floor:
                self.kept.pop(0)
            yield seg

    def segment_of(self, step: int) -> Segment | None:
        """The segment that holds ``step`` of the pass under way (None: past the epoch's last
        step), where the loop may still ask for it."""
        for seg in reversed(self.kept):
            if seg.steps_before <= step < seg.steps_end:
                return seg
        return self.source.segment_at(self, step)

    def known_position(self) -> tuple[int, int]:
        """The place of a ``state_dict()`` without one (see there), or ``ValueError``."""
        if self.stage == READY:
            return self.start
        if self.options.drawn_is_trained and not self.reader.reads_ahead:
            # Declared: what was drawn was trained. StatefulDataLoader's workers take states
            # at its draw count, also inside micro_batches(), which counts the loop's batches.
            return self.position
        if self.trained is not None:
            return self.trained
        raise unknown_position(self.reader, self.count)

    def check_ranks(self, mine: dict) -> None:
        """Every rank plans the same epoch from the same place: one all-gather of the plan
        fingerprint ``mine`` with the epoch and the resume point, unless the ranks agreed on
        them already."""
        mine = mine | {"epoch": self.epoch, "resume": self.source.resume_key(self)}
        key = tuple(sorted((k, repr(v)) for k, v in mine.items()))
        if self.verified != key:
            verify_same_plan(mine, self.owner)
            self.verified = key

    # -- state ----------------------------------------------------------------------------
    def state_dict(self, mine: dict, steps_done, mbd) -> dict:
        """The sampler's state at this position (``steps_done`` or ``mbd``,
        micro_batches_done, when given, else ``known_position``), with the plan fingerprint
        ``mine``."""
        drawn = self.known_position() if steps_done is None and mbd is None else self.position
        return self.source.state(self, mine, drawn, steps_done, mbd)

    def load_state_dict(self, state: dict, mine: dict) -> None:
        """Continue at the position of ``state``, checked against this sampler's plan
        fingerprint ``mine``; on ``ValueError`` the cursor stays as it was."""
        epoch, token, start, plan = self.source.load(self, state, mine)
        self.new_epoch(epoch)
        self.token, self.start, self.cached_plan = token, start, plan
        self.position = start
        self.resume_pending = True
        self.verified = None
