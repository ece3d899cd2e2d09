"""``split_sequence`` refuses misuse on every member of the group (a member number that is not
the rank's place, a group whose size is not the degree, members running different
micro-batches), never silently and never by hanging or aborting; its effect on new forwards
ends with its block, while a backward after the block still recomputes checkpointed blocks
on the shares; and the parallel package imports without a cycle. Diffusers' Wan at a tiny
size, on 2 gloo ranks."""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.utils.checkpoint

from adaptiveload.parallel import split_sequence
from processes import run_on_ranks
from split_models import _inputs, _loss, _reference, _seed, _wan

PARALLEL = pathlib.Path(__file__).resolve().parents[2] / "python" / "adaptiveload" / "parallel"


def _refusal(fn) -> str:
    """The refusal ``fn()`` raises (``type: message``), or "ran" where it runs."""
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return "ran"


def _summed_grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g)
        out[n] = g
    return out


def _misuse_rank(rank, world, seed):
    """Each misuse on both ranks, in turn (the group is the world's 2 ranks); after them, a
    correct split whose summed gradient the test checks (the refusals left no collective
    pending)."""
    group = dist.group.WORLD
    model = _wan()
    inputs, target = _inputs("wan", "odd", seed)

    def run(member, degree=2, **changed):
        def go():
            with split_sequence(model, group, degree, member):
                _loss("wan", model, {**inputs, **changed}, target)

        return _refusal(go)

    g = torch.Generator().manual_seed(seed + 1 + rank)
    other = _inputs("wan", "even", seed)[0]
    found = {
        "same member": run(0),
        "swapped members": run(1 - rank),
        "degree not the group's size": run(rank, degree=4),
        "timestep": run(rank, timestep=inputs["timestep"] + 100.0 * rank),
        "latents": run(rank, hidden_states=torch.randn(inputs["hidden_states"].shape, generator=g)),
        "text": run(rank, encoder_hidden_states=inputs["encoder_hidden_states"] * (1 + rank)),
        "shape": run(
            rank, hidden_states=other["hidden_states"] if rank else inputs["hidden_states"]
        ),
    }
    model.zero_grad(set_to_none=True)
    with split_sequence(model, group, 2, rank):
        loss = _loss("wan", model, inputs, target)
    loss.backward()
    return {"found": found, "grads": _summed_grads(model)}


REFUSALS = {
    "same member": r"ValueError: .*member 1 of the group passed member=0",
    "swapped members": r"ValueError: .*member 0 of the group passed member=1",
    "degree not the group's size": r"ValueError: .*group of 2 ranks.*degree=4",
    "timestep": r"RuntimeError: .*different micro-batches.*timestep",
    "latents": r"RuntimeError: .*different micro-batches.*hidden states",
    "text": r"RuntimeError: .*different micro-batches.*text",
    "shape": r"RuntimeError: .*different micro-batches.*hidden states of shape",
}


@pytest.mark.distributed
def test_misuse_is_refused_on_every_member(tmp_path):
    """Two members passing member=0, members swapped, a degree that is not the group's size,
    members running different micro-batches (another timestep, other latents, another text,
    another shape): every member raises, naming what differs, and a correct split after them
    gives the gradient of the sample processed whole."""
    import re

    seed = _seed()
    results = run_on_ranks(_misuse_rank, 2, tmp_path, "misuse", seed)
    for rank, res in enumerate(results):
        for case, pattern in REFUSALS.items():
            assert re.search(pattern, res["found"][case], re.S), (rank, case, res["found"][case])
    _, ref = _reference("wan", ["odd"], seed)
    for n, g in ref.items():
        torch.testing.assert_close(results[0]["grads"][n], g, rtol=1e-5, atol=1e-6, msg=n)


CHECKPOINTING = ("blocks", "blocks, reentrant", "whole model")


def _checkpointed_loss(model, how, inputs, target):
    """The loss with every block checkpointed (diffusers' own loop: non-reentrant or
    reentrant), or with one non-reentrant checkpoint around the whole model."""
    if how == "whole model":

        def whole(**kw):
            return model(**kw, return_dict=False)[0]

        out = torch.utils.checkpoint.checkpoint(whole, use_reentrant=False, **inputs)
        return ((out.float() - target) ** 2).mean()
    if not model.gradient_checkpointing:
        ckpt = functools.partial(
            torch.utils.checkpoint.checkpoint, use_reentrant=how == "blocks, reentrant"
        )
        model.enable_gradient_checkpointing(gradient_checkpointing_func=ckpt)
    return _loss("wan", model, inputs, target)


def _lifetime_rank(rank, world, seed):
    """For each way of checkpointing: a split forward in its block; outside the block, a
    forward and backward of another sample on rank 0 only (whole: no collective), then the
    split forward's backward (recomputing its blocks on the shares)."""
    group = dist.group.WORLD
    out = {}
    for how in CHECKPOINTING:
        model = _wan()
        inputs, target = _inputs("wan", "odd", seed)
        with split_sequence(model, group, 2, rank):
            loss = _checkpointed_loss(model, how, inputs, target)
        if rank == 0:
            other, other_target = _inputs("wan", "even", seed + 1)
            _checkpointed_loss(model, how, other, other_target).backward()
            out[how, "whole"] = {n: p.grad.clone() for n, p in model.named_parameters()}
            model.zero_grad(set_to_none=True)
        loss.backward()
        out[how, "split"] = _summed_grads(model)
    return out


@pytest.mark.distributed
def test_forward_after_the_block_runs_whole_and_checkpointed_backward_stays_split(tmp_path):
    """With every block checkpointed (reentrant or not), or the whole model: a forward of the
    model after the block, on one rank only, runs the whole model (its gradient is the whole
    sample's; it waits on no other rank), and the split forward's backward after the block
    recomputes on the shares (the summed gradient is the whole sample's)."""
    seed = _seed()
    results = run_on_ranks(_lifetime_rank, 2, tmp_path, "lifetime", seed)
    _, ref_split = _reference("wan", ["odd"], seed)
    _, ref_whole = _reference("wan", ["even"], seed + 1)
    for how in CHECKPOINTING:
        for n, g in ref_whole.items():
            got = results[0][how, "whole"][n]
            torch.testing.assert_close(got, g, rtol=1e-5, atol=1e-6, msg=(how, n))
        for res in results:
            for n, g in ref_split.items():
                got = res[how, "split"][n]
                torch.testing.assert_close(got, g, rtol=1e-5, atol=1e-6, msg=(how, n))


def _imports(path: pathlib.Path) -> set[str]:
    """The modules of adaptiveload.parallel that ``path`` imports, at its top or inside
    functions (absolute or relative), or names as a string (``importlib.import_module``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = "adaptiveload.parallel" + (f".{base}" if base else "")
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # a module imported by name (importlib)
    own = {f"adaptiveload.parallel.{p.stem}" for p in PARALLEL.glob("*.py")}
    return {n for n in names if n in own} - {"adaptiveload.parallel.__init__"}


def test_parallel_imports_no_cycle():
    """No module of adaptiveload.parallel imports, directly or through others, one that
    imports it back (the package's ``__init__`` aside, which only re-exports)."""
    graph = {
        f"adaptiveload.parallel.{p.stem}": _imports(p)
        for p in PARALLEL.glob("*.py")
        if p.stem != "__init__"
    }
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    cycles.append(path + [nxt])
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert not cycles, cycles
