"""Activation checkpointing of the first n Wan blocks (set_checkpointed_blocks): the same
outputs and gradients as the unmodified model, exactly the first n blocks recomputed, n
switched per step, saved and copied models, and DDP / FSDP2 ranks using different n."""

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from adaptiveload.integrations.diffusers import apply_fused_ops  # noqa: E402
from adaptiveload.models.checkpointing import checkpointed_blocks, set_checkpointed_blocks  # noqa: E402
from adaptiveload.models.wan import build_wan, random_batch  # noqa: E402
from processes import full_grads, run_on_ranks  # noqa: E402

L = 3
# Checkpointing recomputes the same fp32 ops on CPU; only reduction order may differ.
RTOL, ATOL = 1e-6, 1e-7


def make_inputs(model, seed, batch=2):
    g = torch.Generator().manual_seed(seed)
    return random_batch(model, batch, 5, 32, 48, text_len=8, generator=g)


def loss_of(out):
    # A fixed random projection makes every output element matter to the gradients.
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return (out.float() * weight).sum()


def train_step(model, inputs, params=None):
    params = params or model
    params.zero_grad(set_to_none=True)
    out = model(**inputs, return_dict=False)[0]
    loss_of(out).backward()
    grads = {n: p.grad.detach().clone() for n, p in params.named_parameters()}
    return out.detach(), grads


def assert_same(a, b):
    out_a, grads_a = a
    out_b, grads_b = b
    torch.testing.assert_close(out_a, out_b, rtol=RTOL, atol=ATOL)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_b:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=RTOL, atol=ATOL, msg=name)


class ForwardCounter:
    """Forward calls per block: a checkpointed block runs twice in a training step (forward,
    then recomputed in backward), the others once."""

    def __init__(self, model):
        self.calls = [0] * len(model.blocks)
        for i, block in enumerate(model.blocks):
            block.register_forward_pre_hook(self._counter(i))

    def _counter(self, i):
        def hook(module, args):
            self.calls[i] += 1

        return hook

    def take(self):
        calls, self.calls[:] = list(self.calls), [0] * len(self.calls)
        return calls


def expected_calls(n):
    return [2] * n + [1] * (L - n)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("n", [0, 1, L - 1, L])
def test_first_n_blocks_are_checkpointed_with_unchanged_results(n, fused):
    ref = build_wan("tiny", layers=L, seed=11, fused=fused)
    model = set_checkpointed_blocks(copy.deepcopy(ref), n)
    assert checkpointed_blocks(model) == n and checkpointed_blocks(ref) == 0
    counter = ForwardCounter(model)
    inputs = make_inputs(ref, seed=int(torch.randint(0, 2**31, ())))
    assert_same(train_step(model, inputs), train_step(ref, inputs))
    assert counter.take() == expected_calls(n)


def saved_outside_checkpoints(model, inputs):
    """Tensors autograd keeps for backward between forward and backward; those saved inside a
    checkpointed block are dropped (the checkpoint's own hooks take them)."""
    count = [0]

    def pack(t):
        count[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**inputs, return_dict=False)[0]
    loss_of(out).backward()
    return count[0]


def test_each_checkpointed_block_frees_its_saved_tensors():
    model = build_wan("tiny", layers=L, seed=12, fused=True)
    inputs = make_inputs(model, seed=3)
    saved = []
    for n in range(L + 1):
        set_checkpointed_blocks(model, n)
        saved.append(saved_outside_checkpoints(model, inputs))
    per_block = saved[0] - saved[1]
    assert per_block > 0
    assert np.diff(saved).tolist() == [-per_block] * L, saved


def test_switching_n_between_steps():
    ref = build_wan("tiny", layers=L, seed=13)
    model = copy.deepcopy(ref)
    counter = ForwardCounter(model)
    for step, n in enumerate([L, 0, 2, 1, L, np.int64(1)]):
        set_checkpointed_blocks(model, n)
        assert checkpointed_blocks(model) == n
        inputs = make_inputs(ref, seed=100 + step, batch=1 + step % 2)
        assert_same(train_step(model, inputs), train_step(ref, inputs))
        assert counter.take() == expected_calls(int(n)), f"step {step}, n = {n}"


def test_no_grad_forward_runs_no_checkpoint(monkeypatch):
    ref = build_wan("tiny", layers=L, seed=14, fused=True)
    model = set_checkpointed_blocks(copy.deepcopy(ref), L)
    checkpoint_calls = []
    checkpoint = torch.utils.checkpoint.checkpoint

    def counting_checkpoint(*args, **kwargs):
        checkpoint_calls.append(kwargs.get("use_reentrant"))
        return checkpoint(*args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting_checkpoint)
    counter = ForwardCounter(model)
    inputs = make_inputs(ref, seed=5)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            out = model(**inputs, return_dict=False)[0]
            torch.testing.assert_close(out, ref(**inputs, return_dict=False)[0], rtol=0, atol=0)
        assert counter.take() == [1] * L and checkpoint_calls == []
    train_step(model, inputs)
    assert checkpoint_calls == [False] * L  # non-reentrant, one per block


def checkpoint_calls_in_a_step(model, monkeypatch):
    """The ``torch.utils.checkpoint.checkpoint`` calls of one training step of ``model``."""
    calls = []
    original = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return original(fn, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch.utils.checkpoint, "checkpoint", counting)
        train_step(model, make_inputs(model, seed=7))
    return calls


def test_bad_n_is_refused_and_none_restores_the_prior_setting(monkeypatch):
    model = build_wan("tiny", layers=L, seed=15)
    for bad in (-1, L + 1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=rf"n = {bad!r} .* L = {L}"):
            set_checkpointed_blocks(model, bad)
    assert checkpointed_blocks(model) == 0 and not model.gradient_checkpointing

    # Without a prior setting: back to diffusers' plain loop, no marks left.
    set_checkpointed_blocks(model, 2)
    set_checkpointed_blocks(model, None)
    assert not model.gradient_checkpointing and checkpointed_blocks(model) == 0
    assert all("_adaptiveload_checkpointed" not in vars(b) for b in model.blocks)
    assert checkpoint_calls_in_a_step(model, monkeypatch) == []
    set_checkpointed_blocks(model, None)  # nothing to undo: a no-op

    # diffusers' own checkpointing (every block) comes back as it was.
    model.enable_gradient_checkpointing()
    assert checkpointed_blocks(model) == L
    set_checkpointed_blocks(model, 1)
    set_checkpointed_blocks(model, 0)  # a second call keeps the first call's prior
    assert checkpointed_blocks(model) == 0
    assert checkpoint_calls_in_a_step(model, monkeypatch) == []
    set_checkpointed_blocks(model, None)
    assert model.gradient_checkpointing and checkpointed_blocks(model) == L
    assert len(checkpoint_calls_in_a_step(model, monkeypatch)) == L

    with pytest.raises(ValueError, match="holds 0 video transformers of a known family"):
        set_checkpointed_blocks(torch.nn.Linear(2, 2), 0)


def test_policy_survives_torch_save_and_deepcopy(tmp_path):
    ref = build_wan("tiny", layers=L, seed=16, fused=True)
    model = set_checkpointed_blocks(copy.deepcopy(ref), 2)
    torch.save(model, tmp_path / "model.pt")
    back = torch.load(tmp_path / "model.pt", weights_only=False)
    clone = copy.deepcopy(model)
    inputs = make_inputs(ref, seed=6)
    expected = train_step(ref, inputs)
    for m in (back, clone):
        assert checkpointed_blocks(m) == 2
        counter = ForwardCounter(m)
        assert_same(train_step(m, inputs), expected)
        assert counter.take() == expected_calls(2)
    # The copy has its own marks: changing it leaves the original alone.
    set_checkpointed_blocks(clone, L)
    assert checkpointed_blocks(model) == 2 and checkpointed_blocks(clone) == L
    # The loaded copy can still be undone.
    set_checkpointed_blocks(back, None)
    assert checkpointed_blocks(back) == 0 and not back.gradient_checkpointing


def test_fused_ops_applied_after_the_policy():
    ref = build_wan("tiny", layers=L, seed=17, fused=True)
    model = set_checkpointed_blocks(build_wan("tiny", layers=L, seed=17), 2)
    apply_fused_ops(model)
    counter = ForwardCounter(model)
    inputs = make_inputs(ref, seed=7)
    assert_same(train_step(model, inputs), train_step(ref, inputs))
    assert counter.take() == expected_calls(2)


# -- DDP and FSDP2: ranks checkpoint different blocks in the same step ---------------------------

WORLD = 2
# n per (step, rank): the ranks differ in each step, and each rank changes n between steps.
RANK_N = [(1, L), (L, 0)]
SEED = 18


def rank_inputs(model, step, rank):
    return make_inputs(model, seed=1000 + 10 * step + rank)


def parallel_worker(rank, world, wrap):
    model = build_wan("tiny", layers=L, seed=SEED, fused=True)
    counter = ForwardCounter(model)
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        wrapped = fully_shard(model)
    steps = []
    for step, ns in enumerate(RANK_N):
        set_checkpointed_blocks(wrapped, ns[rank])
        model.zero_grad(set_to_none=True)
        out = wrapped(**rank_inputs(model, step, rank), return_dict=False)[0]
        loss_of(out).backward()
        steps.append({"grads": full_grads(model), "calls": counter.take()})
    return {"steps": steps}


@pytest.mark.distributed
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_ranks_with_different_n_match_one_process_without_checkpointing(tmp_path, wrap):
    results = run_on_ranks(parallel_worker, WORLD, tmp_path, wrap, wrap)
    ref = build_wan("tiny", layers=L, seed=SEED, fused=True)
    for step, ns in enumerate(RANK_N):
        # One process, no checkpointing: the mean of the ranks' losses over the same samples.
        ref.zero_grad(set_to_none=True)
        for rank in range(WORLD):
            out = ref(**rank_inputs(ref, step, rank), return_dict=False)[0]
            (loss_of(out) / WORLD).backward()
        for rank, r in enumerate(results):
            got = r["steps"][step]
            assert got["calls"] == expected_calls(ns[rank]), (step, rank)
            for name, p in ref.named_parameters():
                torch.testing.assert_close(
                    got["grads"][name], p.grad, rtol=1e-5, atol=1e-6, msg=f"{step} {name}"
                )


def test_the_diffusers_integration_keeps_the_checkpointing_names():
    # Documented there before block checkpointing got its own module (it serves every family);
    # a model saved then refers to the checkpointing function by that module's name.
    import pickle

    from adaptiveload.integrations import diffusers
    from adaptiveload.models import checkpointing

    for name in ("set_checkpointed_blocks", "checkpointed_blocks"):
        assert getattr(diffusers, name) is getattr(checkpointing, name), name
    saved = b"cadaptiveload.integrations.diffusers\n_checkpoint_marked_block\n."
    assert pickle.loads(saved).__module__ == "adaptiveload.models.checkpointing"
