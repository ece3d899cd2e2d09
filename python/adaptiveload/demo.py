"""Built-in demo data: realistic image + video mixes for Wan 2.1 training.

Shapes are (num_frames, height, width) in pixels; weights are shares of samples. For another
model (``demo_metadata(..., geometry=family.geometry)``) the tokens are that model's count, of
the largest shapes within the mix's that the model takes (Mochi: 79 frames for 81).
"""

from __future__ import annotations

import numpy as np

from adaptiveload.metadata import Metadata
from adaptiveload.wan import wan_seq_len

# name -> [(frames, height, width, share of samples)]
MIXES: dict[str, list[tuple[int, int, int, float]]] = {
    # Joint image-video pre-training: nine images for every video. Equal-token buckets
    # lose about 38% of GPU time on it at 8 ranks, as in the paper's setting.
    "joint-pretrain": [
        (1, 480, 832, 0.60),
        (1, 720, 1280, 0.30),
        (81, 480, 832, 0.05),
        (49, 720, 1280, 0.02),
        (81, 720, 1280, 0.03),
    ],
    # Images and 480p/720p clips of 1-5 s, as in a Wan 2.1 fine-tuning set.
    "wan-mix": [
        (1, 480, 832, 0.30),
        (1, 720, 1280, 0.10),
        (17, 480, 832, 0.05),
        (33, 480, 832, 0.05),
        (49, 480, 832, 0.05),
        (81, 480, 832, 0.20),
        (33, 720, 1280, 0.05),
        (49, 720, 1280, 0.05),
        (81, 720, 1280, 0.15),
    ],
    # Mostly images with some long videos (pre-training on image-text pairs).
    "image-heavy": [
        (1, 480, 832, 0.55),
        (1, 720, 1280, 0.20),
        (1, 832, 480, 0.05),
        (81, 480, 832, 0.10),
        (81, 720, 1280, 0.10),
    ],
    # Mostly videos of all lengths (video-focused stage).
    "video-heavy": [
        (1, 480, 832, 0.10),
        (17, 480, 832, 0.10),
        (33, 480, 832, 0.10),
        (49, 480, 832, 0.10),
        (81, 480, 832, 0.25),
        (33, 720, 1280, 0.05),
        (49, 720, 1280, 0.10),
        (81, 720, 1280, 0.20),
    ],
}


def demo_shapes(mix: str, geometry=None) -> list[tuple[int, int, int]]:
    """The shapes of ``MIXES[mix]``, each as the largest within it that ``geometry``'s model
    takes (``Geometry.round_shape``; the mix's own without a geometry)."""
    if mix not in MIXES:
        raise ValueError(f"unknown demo mix {mix!r}; choose from {sorted(MIXES)}")
    shapes = [s[:3] for s in MIXES[mix]]
    return shapes if geometry is None else [geometry.round_shape(*s) for s in shapes]


def demo_metadata(
    num_samples: int = 20_000, mix: str = "joint-pretrain", seed: int = 0, geometry=None
) -> Metadata:
    """Draw ``num_samples`` shapes from ``MIXES[mix]`` (deterministic in ``seed``), their tokens
    counted by ``geometry`` (an ``adaptiveload.geometry.Geometry``; default Wan 2.1's) of the
    shapes its model takes (``demo_shapes``)."""
    table = np.array(demo_shapes(mix, geometry), dtype=np.int64)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if seed < 0:  # numpy's message would not name it
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    share = np.array([s[3] for s in MIXES[mix]], dtype=np.float64)
    pick = np.random.default_rng(seed).choice(len(table), size=num_samples, p=share / share.sum())
    shapes = table[pick]
    count = wan_seq_len if geometry is None else geometry.seq_len
    return Metadata(seq_lens=count(shapes[:, 0], shapes[:, 1], shapes[:, 2]), shapes=shapes)
