"""Tokens of a sample, for any video DiT whose VAE keeps the first frame and compresses each
further ``vt`` frames into one latent frame, ``vh x vw`` pixels into one latent element, and
whose transformer cuts the latent into ``pt x ph x pw`` patches:

    S = ((F - 1) // vt + 1) // pt  *  (H // vh // ph)  *  (W // vw // pw)  +  extra

``extra``: tokens every sample carries in the sequence its attention runs over besides the
video's (the text tokens of a joint-attention MMDiT such as HunyuanVideo; 0 where text
enters by cross-attention, as in Wan and LTX-Video).

Plain Python and numpy: the metadata readers, the demo mixes and calibration count tokens
with it; ``adaptiveload.models`` holds each family's geometry."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Geometry:
    """A family's token geometry: VAE stride and patch size, each ``(frames, height,
    width)``, and the extra tokens per sample."""

    name: str
    vae_stride: tuple[int, int, int]
    patch: tuple[int, int, int]
    extra_tokens: int = 0

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int]:
        """``(F', H', W')`` of the VAE latent of a ``(frames, height, width)`` pixel clip."""
        vt, vh, vw = self.vae_stride
        return (frames - 1) // vt + 1, height // vh, width // vw

    def seq_len(self, frames, height, width):
        """S of samples of these shapes, vectorized over numpy arrays (a Python int for
        scalars); ``ValueError`` naming the sample for a non-integer size or a sample
        smaller than one patch."""
        return seq_len(frames, height, width, self.vae_stride, self.patch, self.extra_tokens,
                       name=f"{self.name} seq_len")  # fmt: skip


def seq_len(frames, height, width, vae_stride, patch, extra=0, *, name="seq_len"):
    """``Geometry.seq_len`` with the geometry given as arguments (``name`` in messages)."""
    f = np.asarray(frames)
    h = np.asarray(height)
    w = np.asarray(width)
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
    seq = ((f - 1) // vt + 1) // pt * (h // vh // ph) * (w // vw // pw)
    if np.any(seq < 1):
        bad = np.flatnonzero(np.atleast_1d(seq) < 1)[0]
        raise ValueError(
            f"{name}: sample {bad} ({np.atleast_1d(f)[bad]}x{np.atleast_1d(h)[bad]}x"
            f"{np.atleast_1d(w)[bad]}) is smaller than one patch"
        )
    seq = seq + extra
    return int(seq) if seq.ndim == 0 else seq
