"""Token counts of video/image samples after the VAE and patchify.

Kept for ``adaptiveload.seqlen.wan_seq_len``; the function and Wan 2.1's geometry live in
``adaptiveload.wan``.
"""

from __future__ import annotations

from adaptiveload.wan import wan_seq_len

__all__ = ["wan_seq_len"]
