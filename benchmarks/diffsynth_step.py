"""What do the fused ops take and save in a DiffSynth-Studio Wan training step?

DiffSynth-Studio's own ``WanModel`` at the Wan-2.1-1.3B shape (dim 1536, FFN 8960, 12 heads,
text context 512 tokens; ``--layers`` of its 30 blocks), bf16 weights and stream, one sample of
``--frames x --height x --width`` latents (default 21 x 30 x 52 after the (1, 2, 2) patch: a
480x832, 81-frame clip, 32,760 tokens). Each step is the forward and backward of the block
stack, as ``model_fn_wan_video`` runs it (the patch embedding, text and time embeddings and the
head are outside the blocks and well under 1% of the step), timed with CUDA events:

- with DiffSynth's ``DiTBlock.forward`` (its LayerNorms, modulate and GateModule);
- with ``adaptiveload.integrations.diffsynth.apply_fused_ops``.

Reported: ms per step for both, the time saved as a share of DiffSynth's step, and the fused
kernels' own GPU time as a share of the fused step (torch.profiler, one step).

    python benchmarks/diffsynth_step.py [--layers 6] [--csv FILE] [--write]

DiffSynth's package ``__init__`` imports its data pipeline (torchvision, imageio, pandas, ...);
where those are missing (the GPU machine has no network) the model module is loaded without
the package ``__init__`` (``--bare-import``, or automatically when the import fails).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import types
from datetime import date

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WAN_13B = dict(dim=1536, ffn_dim=8960, num_heads=12, text_dim=4096, freq_dim=256, in_dim=16)


def import_wan_model(bare: bool):
    """DiffSynth's WanModel class; `bare`: without running the diffsynth package __init__."""
    if not bare:
        try:
            from diffsynth.models.wan_video_dit import WanModel

            return WanModel
        except ImportError as e:
            print(f"diffsynth import failed ({e}); loading its model module bare", flush=True)
    spec = importlib.util.find_spec("diffsynth")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("diffsynth is not installed (pip install diffsynth==2.1.12)")
    root = list(spec.submodule_search_locations)[0]
    for name in [m for m in sys.modules if m == "diffsynth" or m.startswith("diffsynth.")]:
        del sys.modules[name]
    for name, sub in (
        ("diffsynth", ""),
        ("diffsynth.core", "core"),
        ("diffsynth.models", "models"),
    ):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(root, sub)]
        sys.modules[name] = pkg
    from diffsynth.models.wan_video_dit import WanModel

    return WanModel


def build(WanModel, layers, device):
    torch.manual_seed(0)
    model = WanModel(
        **WAN_13B, out_dim=16, eps=1e-6, patch_size=(1, 2, 2), num_layers=layers,
        has_image_input=False,
    )  # fmt: skip
    return model.to(device=device, dtype=torch.bfloat16).train()


def step_inputs(model, f, h, w, device):
    """Block inputs as model_fn_wan_video forms them, for one sample of f x h x w tokens."""
    g = torch.Generator(device="cpu").manual_seed(1)
    d = model.dim
    x = torch.randn(1, f * h * w, d, generator=g).to(device, torch.bfloat16).requires_grad_()
    context = torch.randn(1, 512, d, generator=g).to(device, torch.bfloat16)
    t_mod = (0.1 * torch.randn(1, 6, d, generator=g)).to(device, torch.bfloat16)
    freqs = (
        torch.cat(
            [
                model.freqs[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
                model.freqs[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
                model.freqs[2][:w].view(1, 1, w, -1).expand(f, h, w, -1),
            ],
            dim=-1,
        )
        .reshape(f * h * w, 1, -1)
        .to(device)
    )
    return x, context, t_mod, freqs


def run_step(model, x, context, t_mod, freqs, dy):
    y = x
    for block in model.blocks:
        y = block(y, context, t_mod, freqs)
    y.backward(dy)


def time_steps(model, inputs, dy, warmup, steps):
    for _ in range(warmup):
        run_step(model, *inputs, dy)
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run_step(model, *inputs, dy)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        for p in model.parameters():
            p.grad = None
        inputs[0].grad = None
    return statistics.median(times)


def kernel_share(run) -> float:
    """GPU time of our kernels (the fused ops) / all kernels in one ``run()`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    ours = total = 0.0
    for e in prof.key_averages():
        t = e.device_time_total
        if t <= 0 or e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        total += t
        if "adaptiveload" in e.key or "norm_modulate" in e.key:
            ours += t
    return ours / total if total else float("nan")


def fused_kernel_share(model, inputs, dy):
    """``kernel_share`` of one fused step."""
    return kernel_share(lambda: run_step(model, *inputs, dy))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--frames", type=int, default=21)
    ap.add_argument("--height", type=int, default=30)
    ap.add_argument("--width", type=int, default=52)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bare-import", action="store_true", help="skip diffsynth's __init__")
    ap.add_argument("--csv", help="append the result row to this CSV")
    ap.add_argument("--write", action="store_true", help="store the CSV under benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("diffsynth_step.py needs a CUDA GPU", file=sys.stderr)
        return 1
    WanModel = import_wan_model(args.bare_import)
    from adaptiveload.integrations.diffsynth import apply_fused_ops

    dev = torch.device("cuda")
    model = build(WanModel, args.layers, dev)
    f, h, w = args.frames, args.height, args.width
    inputs = step_inputs(model, f, h, w, dev)
    dy = torch.randn_like(inputs[0]) * 1e-2
    base = time_steps(model, inputs, dy, args.warmup, args.steps)
    apply_fused_ops(model)
    fused = time_steps(model, inputs, dy, args.warmup, args.steps)
    share = fused_kernel_share(model, inputs, dy)
    row = {
        "date": str(date.today()),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": f"DiffSynth WanModel, Wan-2.1-1.3B shape, {args.layers} of 30 blocks, bf16",
        "tokens": f * h * w,
        "diffsynth_step_ms": round(base, 2),
        "fused_step_ms": round(fused, 2),
        "saved_share": round((base - fused) / base, 4),
        "speedup": round(base / fused, 4),
        "fused_kernels_share_of_step": round(share, 4),
    }
    print(
        f"{row['model']}, {row['tokens']} tokens, forward+backward of the blocks:\n"
        f"  DiffSynth blocks {base:.2f} ms, fused {fused:.2f} ms: {base / fused:.3f}x, "
        f"{(base - fused) / base:.1%} of the step saved; our kernels take {share:.1%} of the "
        "fused step's GPU time"
    )
    sys.path.insert(0, HERE)
    from make_results import append_csv, write_results

    if args.csv:
        append_csv(args.csv, [row])
    if args.write:
        meta = {"date": row.pop("date"), "machine": row.pop("gpu"),
                "command": "python benchmarks/diffsynth_step.py --write"}  # fmt: skip
        print("wrote", write_results("h200/diffsynth_step.csv", list(row), [row.values()], meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
