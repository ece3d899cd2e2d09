"""``Cursor``: one rank's place in an epoch, the state of a sampler's passes over it.

A sampler owns one cursor. It holds the epoch; the epoch's plan (made on first use), the
samples left out of it and the micro-batch of the rank's stream where the next pass starts;
of the pass under way, its stage, the micro-batches handed out, those ``micro_batches(loader)``
received, and who reads them (readers.py); whether a resumed position waits for its pass; and
the plan the ranks last agreed on. Nothing else changes these, and each change is one of its
transitions:

- ``new_epoch(epoch)``: ``set_epoch`` to another epoch, from its start;
- ``again()``: a new pass over an epoch already done, from its start;
- ``begin(reader)``: a pass starts; ``handed``, ``finish`` and ``received`` follow it
  (iteration.py);
- ``load_state_dict``: a saved position (resume.py), taken whole or not at all;

and ``state_dict`` is the position a sampler saves."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from adaptiveload.sampler import resume
from adaptiveload.sampler.checks import Options
from adaptiveload.sampler.iteration import place_of, position_of
from adaptiveload.sampler.plan import Plan
from adaptiveload.sampler.ranks import verify_same_plan
from adaptiveload.sampler.readers import PLAIN, Reader, unknown_position

READY, RUNNING, DONE = "ready", "running", "done"


class Cursor:
    """One rank's place in an epoch.

    Args:
        owner: the sampler's name, for messages.
        options: the sampler's settings (rank, K, uneven counts, ``drawn_is_trained``).
        make_plan: ``(epoch, excluded) -> Plan``, the epoch's plan without the samples
            ``excluded`` (None: none).
    """

    def __init__(self, owner: str, options: Options, make_plan: Callable[..., Plan]):
        self.owner = owner
        self.options = options
        self.make_plan = make_plan
        self.new_epoch(0)
        #: the micro-batches of the rank's stream ``micro_batches(loader)`` received, counted
        #: from the plan's start (None: no such loop in this pass)
        self.trained: int | None = None
        #: who reads the pass under way
        self.reader: Reader = PLAIN
        #: the fingerprint, epoch and resume point the ranks last agreed on
        self.verified: tuple | None = None

    def __getstate__(self) -> dict:
        # A copy plans anew and knows no reader (both belong to this process).
        return self.__dict__ | {"cached_plan": None, "reader": PLAIN}

    # -- transitions ----------------------------------------------------------------------
    def new_epoch(self, epoch: int) -> None:
        """Epoch ``epoch``, from its start, no pass begun."""
        self.epoch = epoch
        #: samples left out of this epoch's plan (None: none)
        self.excluded: np.ndarray | None = None
        #: the micro-batch of the rank's stream where the next pass starts
        self.start = 0
        self.cached_plan: Plan | None = None
        #: READY (no pass begun), RUNNING or DONE
        self.stage = READY
        #: micro-batches handed out, counted from the plan's start
        self.position = 0
        #: a resumed position whose epoch ``set_epoch`` must not leave before its pass
        self.resume_pending = False

    def again(self) -> None:
        """The whole epoch again, after a pass that ended (resumed or not)."""
        self.excluded, self.start, self.cached_plan = None, 0, None

    def begin(self, reader: Reader) -> None:
        """A pass starts at ``start``, read by ``reader``."""
        self.reader, self.trained = reader, None
        self.resume_pending = False
        self.stage = RUNNING
        self.position = self.start

    def handed(self, end: int | None = None) -> None:
        """One more micro-batch handed out; at ``end`` (the rank's last) the pass is done."""
        self.position += 1
        if self.position == end:
            self.stage = DONE

    def finish(self) -> None:
        self.stage = DONE

    def received(self, count: int) -> None:
        """``micro_batches(loader)`` has received ``count`` batches of this pass."""
        self.trained = self.start + count

    # -- what it knows ----------------------------------------------------------------------
    def plan(self) -> Plan:
        """The epoch's plan for all ranks (made on first use)."""
        if self.cached_plan is None:
            self.cached_plan = self.make_plan(self.epoch, self.excluded)
        return self.cached_plan

    def place(self) -> tuple[int, int]:
        """Where the next pass starts: ``(step, the rank's micro-batches of it done)``."""
        return place_of(self.plan(), self.options.rank, self.start)

    def left(self) -> int:
        """The rank's micro-batches from ``start`` to the plan's end."""
        return self.plan().num_rank_micro_batches(self.options.rank) - self.start

    def known_position(self) -> int:
        """The position of a ``state_dict()`` without one (see there), or ``ValueError``."""
        if self.stage == READY:
            return self.start
        if self.options.drawn_is_trained and not self.reader.reads_ahead:
            # Declared: what was drawn was trained. StatefulDataLoader's workers take states
            # at its draw count, also inside micro_batches(), which counts the loop's batches.
            return self.position
        if self.trained is not None:
            return self.trained
        raise unknown_position(self.reader, self.position - self.start)

    def check_ranks(self, mine: dict) -> None:
        """Every rank plans the same epoch from the same place: one all-gather of the plan
        fingerprint ``mine`` with the epoch and the resume point, unless the ranks agreed on
        them already."""
        at = "none"
        if self.excluded is not None or self.start:
            h = hashlib.blake2b(self.excluded.tobytes() if self.excluded is not None else b"")
            # With uneven counts the ranks' stream positions differ; their step does not.
            where = f"step {self.place()[0]}" if self.options.uneven_counts else self.start
            at = f"{h.hexdigest()[:16]}@{where}"
        mine = mine | {"epoch": self.epoch, "resume": at}
        key = tuple(sorted((k, repr(v)) for k, v in mine.items()))
        if self.verified != key:
            verify_same_plan(mine, self.owner)
            self.verified = key

    # -- state ----------------------------------------------------------------------------
    def state_dict(self, mine: dict, learned, num_samples: int, steps_done, mbd) -> dict:
        """The sampler's state at this position (``steps_done`` or ``mbd``,
        micro_batches_done, when given, else ``known_position``), with the plan fingerprint
        ``mine`` and the learned times ``learned`` (``Refinement.state_dict()``)."""
        plan, o = self.plan(), self.options
        drawn = self.position
        if steps_done is None and mbd is None:
            drawn = self.known_position()
        position, steps, in_step = position_of(
            plan, o.rank, self.start, drawn, steps_done, mbd, o.uneven_counts
        )
        if steps is None:
            consumed = plan.consumed(position, num_samples)
        else:
            consumed = plan.consumed_steps(steps, num_samples)
        state = resume.make_state(mine, self.epoch, self.excluded, position, consumed, learned)
        if steps is not None:
            state["steps_done"] = steps
        if in_step:
            state["in_step"] = {"rank": o.rank, "micro_batches": in_step}
        return state

    def load_state_dict(self, state: dict, mine: dict, data: str, num_samples: int) -> None:
        """Continue at the position of ``state`` (``resume.check_keys`` passed), checked
        against this sampler's plan fingerprint ``mine`` and data (digest ``data``,
        ``num_samples`` samples); on ``ValueError`` the cursor stays as it was."""
        o = self.options
        saved = resume.read_state(state, mine, data, num_samples)
        excluded, start, plan = resume.continue_at(
            saved,
            mine,
            lambda ex: self.make_plan(saved.epoch, ex),
            o.rank,
            o.micro_batches_per_step,
            o.uneven_counts,
        )
        self.epoch, self.excluded, self.start, self.cached_plan = saved.epoch, excluded, start, plan
        self.stage, self.position = READY, start
        self.resume_pending = True
        self.verified = None
