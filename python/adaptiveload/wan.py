"""Wan 2.1's geometry in one place: VAE stride, patch size, text length, the transformer
configurations, and the token count of a sample (``wan_seq_len``; ``token_count`` for any
VAE stride and patch, which ``adaptiveload.geometry`` uses for the other families).

Plain Python and numpy (no torch, no diffusers): the metadata readers, the demo mixes and
calibration count tokens with ``wan_seq_len``; ``adaptiveload.models.wan`` builds diffusers
models from ``CONFIGS``.
"""

from __future__ import annotations

import numpy as np

# Pixels per latent element, (frames, height, width): the VAE keeps the first frame and
# compresses each further 4 frames into one, and 8 x 8 pixels into one element.
VAE_STRIDE = (4, 8, 8)
# Latent elements per token, (frames, height, width).
PATCH = (1, 2, 2)
# Text tokens per sample (umT5 embeddings, padded to this length).
TEXT_LEN = 512

# Keyword arguments of diffusers' WanTransformer3DModel (patch_size=PATCH besides).
CONFIGS: dict[str, dict] = {
    # A model of a few thousand parameters, for CPU tests.
    "tiny": dict(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
    ),
    "wan2.1-1.3B": dict(
        num_attention_heads=12,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=4096,
        freq_dim=256,
        ffn_dim=8960,
        num_layers=30,
    ),
    "wan2.1-14B": dict(
        num_attention_heads=40,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=4096,
        freq_dim=256,
        ffn_dim=13824,
        num_layers=40,
    ),
}

# (frames, height, width) in pixels that calibration profiles: images, 480p and 720p clips
# up to 81 frames.
SHAPES = [
    (1, 480, 832),
    (1, 720, 1280),
    (17, 480, 832),
    (33, 480, 832),
    (49, 480, 832),
    (81, 480, 832),
    (49, 720, 1280),
    (81, 720, 1280),
]


def latent_shape(frames: int, height: int, width: int, channels: int) -> tuple[int, int, int, int]:
    """(C, F', H', W') of the VAE latent of a (frames, height, width) pixel clip."""
    return (
        channels,
        (frames - 1) // VAE_STRIDE[0] + 1,
        height // VAE_STRIDE[1],
        width // VAE_STRIDE[2],
    )


class ShapeError(ValueError):
    """A sample whose shape the model cannot take: ``index`` (its position in the arrays
    given), ``dimension`` (``"frames"``, ``"height"`` or ``"width"``), ``shape`` (``"FxHxW"``)
    and ``rule`` (what the model takes), so that a caller can name its own row and column."""

    def __init__(self, name: str, index: int, dimension: str, shape: str, rule: str):
        super().__init__(f"{name}: sample {index} ({shape}): {rule}")
        self.index, self.dimension, self.shape, self.rule = index, dimension, shape, rule


def token_count(
    frames,
    height,
    width,
    vae_stride,
    patch,
    extra=0,
    *,
    name="token_count",
    frame_step=1,
    size_step=1,
    model=None,
):
    """Tokens of samples of a video DiT whose VAE keeps the first frame and compresses each
    further ``vt`` frames into one and ``vh x vw`` pixels into one element, cut into
    ``pt x ph x pw`` patches, plus ``extra`` tokens per sample (see adaptiveload.geometry),
    vectorized over numpy arrays; ``ValueError`` names the sample (``name`` in messages).
    The model (``model`` in messages) takes ``frame_step * k + 1`` frames, and heights and
    widths that are multiples of ``size_step``: a shape it cannot take, or one smaller than a
    patch, is a ``ShapeError`` naming the sample, the dimension and the rule.
    Here, not in geometry.py, so that this file needs nothing but numpy."""
    f, h, w = np.broadcast_arrays(np.asarray(frames), np.asarray(height), np.asarray(width))
    for what, a in (("frames", f), ("height", h), ("width", w)):
        if a.dtype.kind not in "iu":
            if a.dtype.kind != "f" or not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
                raise ValueError(f"{name}: {what} must hold integers, got dtype {a.dtype}")
        if np.any(a < 1):
            bad = np.flatnonzero(np.atleast_1d(a) < 1)[0]
            raise ValueError(f"{name}: {what}[{bad}] = {np.atleast_1d(a)[bad]} must be >= 1")
    vt, vh, vw = vae_stride
    pt, ph, pw = patch
    f, h, w = (a.astype(np.int64) for a in (f, h, w))
    model = model or name
    step = f"multiples of {size_step}, got {{}}"
    rules = [
        ((f - 1) % frame_step != 0, "frames",
         f"{model} takes {frame_step}k+1 frames (1, {frame_step + 1}, {2 * frame_step + 1}, ...), got {{}}"),
        (h % size_step != 0, "height", f"{model} takes heights that are {step}"),
        (w % size_step != 0, "width", f"{model} takes widths that are {step}"),
        (((f - 1) // vt + 1) // pt < 1, "frames",
         f"smaller than one patch: frames {{}} < {vt * (pt - 1) + 1}"),
        (h // vh // ph < 1, "height", f"smaller than one patch: height {{}} < {vh * ph} pixels"),
        (w // vw // pw < 1, "width", f"smaller than one patch: width {{}} < {vw * pw} pixels"),
    ]  # fmt: skip
    for bad, dimension, rule in rules:
        if np.any(bad):
            i = int(np.flatnonzero(np.atleast_1d(bad))[0])
            fhw = [int(np.atleast_1d(a)[i]) for a in (f, h, w)]
            value = fhw[("frames", "height", "width").index(dimension)]
            shape = "x".join(map(str, fhw))
            raise ShapeError(name, i, dimension, shape, rule.format(value))
    seq = ((f - 1) // vt + 1) // pt * (h // vh // ph) * (w // vw // pw) + extra
    return int(seq) if seq.ndim == 0 else seq


def wan_seq_len(frames, height, width, *, vae_stride=VAE_STRIDE, patch_size=PATCH):
    """Sequence length S of Wan 2.1 samples, vectorized over numpy arrays.

    S = ((F - 1) // vt + 1) // pt  *  (H // vh // ph)  *  (W // vw // pw)

    with VAE stride (vt, vh, vw) = (4, 8, 8) and patch (pt, ph, pw) = (1, 2, 2) by default:
    a 480x832 image is 1,560 tokens, a 480x832 81-frame video 32,760, a 720x1280
    81-frame video 75,600. Returns an int64 array (a Python int for scalar inputs).
    """
    return token_count(frames, height, width, vae_stride, patch_size, name="wan_seq_len")


__all__ = [
    "CONFIGS",
    "PATCH",
    "SHAPES",
    "ShapeError",
    "TEXT_LEN",
    "VAE_STRIDE",
    "latent_shape",
    "token_count",
    "wan_seq_len",
]
