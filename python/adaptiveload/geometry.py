"""Tokens of a sample, for any video DiT whose VAE keeps the first frame and compresses each
further ``vt`` frames into one latent frame, ``vh x vw`` pixels into one latent element, and
whose transformer cuts the latent into ``pt x ph x pw`` patches:

    S = ((F - 1) // vt + 1) // pt  *  (H // vh // ph)  *  (W // vw // pw)  +  extra

``extra``: tokens every sample carries in the sequence its attention runs over besides the
video's (the text tokens of a joint-attention MMDiT such as HunyuanVideo; 0 where text
enters by cross-attention, as in Wan and LTX-Video).

A model may take some shapes only (Mochi: ``6k + 1`` frames, heights and widths that are
multiples of 16): ``frame_step`` and ``size_step`` say which, and a count of any other shape
is refused, naming the sample and the rule.

``adaptiveload.models`` holds each family's geometry; the count itself is
``adaptiveload.wan.token_count`` (numpy only: wan.py loads without torch)."""

from __future__ import annotations

from dataclasses import dataclass

from adaptiveload.wan import token_count


@dataclass(frozen=True)
class Geometry:
    """A family's token geometry: VAE stride and patch size, each ``(frames, height,
    width)``, the extra tokens per sample, and the shapes the model takes."""

    name: str
    vae_stride: tuple[int, int, int]
    patch: tuple[int, int, int]
    extra_tokens: int = 0
    #: the model takes ``frame_step * k + 1`` frames only (1: any number)
    frame_step: int = 1
    #: the model takes heights and widths that are multiples of this only (1: any)
    size_step: int = 1

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int]:
        """``(F', H', W')`` of the VAE latent of a ``(frames, height, width)`` pixel clip."""
        vt, vh, vw = self.vae_stride
        return (frames - 1) // vt + 1, height // vh, width // vw

    def round_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int]:
        """The largest shape within ``(frames, height, width)`` that the model takes (the shape
        itself where it takes any; its smallest height or width where none is within)."""
        fs, ss = self.frame_step, self.size_step
        return (frames - 1) // fs * fs + 1, max(height // ss, 1) * ss, max(width // ss, 1) * ss

    def seq_len(self, frames, height, width):
        """S of samples of these shapes, vectorized over numpy arrays (a Python int for
        scalars); ``ValueError`` naming the sample for a non-integer size, and
        ``adaptiveload.wan.ShapeError`` (a ``ValueError``) naming the sample, the dimension
        and the rule for a shape the model cannot take or smaller than one patch."""
        return token_count(
            frames,
            height,
            width,
            self.vae_stride,
            self.patch,
            self.extra_tokens,
            name=f"{self.name} seq_len",
            frame_step=self.frame_step,
            size_step=self.size_step,
            model=self.name,
        )
