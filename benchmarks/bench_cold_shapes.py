"""What does a micro-batch shape cost the first time the model sees it?

Calibration times each (batch, sequence) shape after warm-up calls; in training, a sampler
that sizes micro-batches to a cost cap hands the model new batch sizes step after step. This
times forward+backward of the Wan-2.1-1.3B configuration (``--layers`` blocks, bf16) for the
first call of a shape and for a repeat, under PyTorch's default attention backend choice and
with each backend forced, and names the backend PyTorch picks.

    python benchmarks/bench_cold_shapes.py [--layers 4]

Needs CUDA and diffusers.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from adaptiveload.models.wan import build_wan, random_batch
from adaptiveload.wan import CONFIGS, wan_seq_len

CONFIG = "wan2.1-1.3B"


def fwd_bwd_ms(model, inputs) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model(**inputs, return_dict=False)[0]
    out.float().square().mean().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000


def chosen_backend(
    batch: int,
    seq: int,
    heads: int = CONFIGS[CONFIG]["num_attention_heads"],
    dim: int = CONFIGS[CONFIG]["attention_head_dim"],
) -> str:
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16)
    q.requires_grad_(True)
    return SDPBackend(torch._fused_sdp_choice(q, q, q)).name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--fused", action="store_true", help="with adaptiveload's fused adaLN ops")
    args = ap.parse_args()
    model = build_wan(
        CONFIG, layers=args.layers, device="cuda", dtype=torch.bfloat16, fused=args.fused
    )
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    image, video = wan_seq_len(1, 480, 832), wan_seq_len(81, 480, 832)
    print(
        f"default backend choice: images B=48 S={image}:",
        chosen_backend(48, image),
        f"| video B=1 S={video}:",
        chosen_backend(1, video),
    )
    settings = {
        "default": None,
        "flash": [SDPBackend.FLASH_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    }
    # (batch, frames, height, width): a long video, then image batches of sizes not seen yet.
    shapes = [(1, 81, 480, 832), (40, 1, 480, 832), (41, 1, 480, 832), (42, 1, 480, 832)]
    print("| attention | shape | first call ms | repeat ms | first - repeat |")
    print("|---|---|---|---|---|")
    offset = 0
    for name, backends in settings.items():
        offset += 3  # every setting sees batch sizes that are new to it
        for b, f, h, w in shapes:
            b = b if b == 1 else b + offset
            inputs = random_batch(model, b, f, h, w)
            try:
                if backends is None:
                    first, again = fwd_bwd_ms(model, inputs), fwd_bwd_ms(model, inputs)
                else:
                    with sdpa_kernel(backends):
                        first, again = fwd_bwd_ms(model, inputs), fwd_bwd_ms(model, inputs)
                print(
                    f"| {name} | {b}x{f}x{h}x{w} | {first:.1f} | {again:.1f} | "
                    f"{first - again:+.1f} |",
                    flush=True,
                )
            except RuntimeError as e:
                print(f"| {name} | {b}x{f}x{h}x{w} | failed: {str(e).splitlines()[0][:80]} | | |")
            model.zero_grad(set_to_none=True)
            del inputs


if __name__ == "__main__":
    main()
