"""The data and model of benchmarks/convergence_wan.py: benchmark sizes (``Setup``,
``SETUPS``), the synthetic image+video task (``SyntheticMix``: latents of moving waves whose
pattern the text carries), the training and validation sets, and the scaled-down
``WanTransformer3DModel`` with its flow-matching loss. See convergence_wan.py for the task."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

# The patch size is the fidelity benchmark's (fidelity_data.py, which supersedes this one), as
# is the model builder convergence_arms uses: one definition for both.
from fidelity_data import PATCH

VAL_T = (0.2, 0.5, 0.8)
MODALITIES = ("image", "clip")


@dataclass(frozen=True)
class Schedule:
    """How one step structure trains: epochs, evaluations per epoch (by samples seen) and the
    AdamW peak learning rate (``Setup.learning_rate`` gives its schedule)."""

    epochs: int
    evals_per_epoch: int
    lr: float


@dataclass(frozen=True)
class Setup:
    """Model, data and schedules of one benchmark size."""

    #: WanTransformer3DModel keyword arguments (patch (1, 2, 2) besides)
    model: dict
    #: ((frames, height, width) of the latent, share of samples); one frame: an image
    mix: tuple
    samples: int
    val_images: int
    val_clips: int
    #: step structure (convergence_arms.STRUCTURES) -> its Schedule
    schedules: dict
    #: linear warm-up over this share of the run's samples, then a cosine decay to
    #: ``final_lr`` times the peak at the end
    warmup: float = 0.05
    final_lr: float = 0.1
    text_len: int = 4
    #: pattern ids per modality, and waves per pattern (each wave a direction in the channels)
    patterns: int = 2
    waves: int = 2
    #: wavelengths (latent pixels) and clip speeds (latent pixels per frame)
    wavelength: tuple = (3.0, 8.0)
    speed: tuple = (0.5, 2.0)
    #: images and clips of pattern i share one text embedding (and differ in waves), so the
    #: same text asks for different latents in each modality: the two pull the text-to-latent
    #: map apart. False: each modality has text ids of its own (the task before issue #34).
    shared_text: bool = True


# The full size: 1 block, 2 heads of 32 (96,576 parameters), fp32; latents of 16-120 tokens,
# about 60% images holding about a quarter of the tokens. 2 patterns of 2 waves per modality:
# a task this model learns to well below the no-structure predictor within the schedules.
_MODEL = dict(
    num_attention_heads=2,
    attention_head_dim=32,
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=32,
    ffn_dim=128,
    num_layers=1,
)
_MIX = (
    ((1, 8, 8), 0.35),
    ((1, 8, 12), 0.25),
    ((3, 8, 8), 0.16),
    ((5, 8, 8), 0.12),
    ((5, 8, 12), 0.12),
)

_STRUCTURES = ("packed_k4", "packed_k1", "b1_k4", "b1_k1")
SETUPS = {
    # 16 CPU cores or one H200: see convergence_wan.py for the run's size and time.
    "full": Setup(
        model=_MODEL,
        mix=_MIX,
        samples=512,
        val_images=24,
        val_clips=24,
        schedules={
            "packed_k4": Schedule(epochs=24, evals_per_epoch=1, lr=1e-2),
            "packed_k1": Schedule(epochs=16, evals_per_epoch=2, lr=5e-3),
            "b1_k4": Schedule(epochs=10, evals_per_epoch=2, lr=1e-2),
            "b1_k1": Schedule(epochs=8, evals_per_epoch=3, lr=5e-3),
        },
    ),
    # CPU, seconds: the end-to-end check of the tests (one block of 2 heads of 8).
    "quick": Setup(
        model=dict(_MODEL, attention_head_dim=8, text_dim=16, freq_dim=16, ffn_dim=32),
        mix=_MIX,
        samples=32,
        val_images=2,
        val_clips=3,
        schedules={s: Schedule(epochs=1, evals_per_epoch=2, lr=5e-3) for s in _STRUCTURES},
    ),
}


def learning_rate(setup: Setup, peak: float, done: float, total: float) -> float:
    """The learning rate of a step that starts with ``done`` of the run's ``total`` samples
    seen: linear warm-up, then cosine decay. By samples, so that arms of one structure, whose
    steps are the same micro-batches dealt differently, follow the same schedule."""
    progress = done / total
    warm = min(1.0, (progress + 1 / total) / setup.warmup) if setup.warmup > 0 else 1.0
    decay = setup.final_lr + (1 - setup.final_lr) * 0.5 * (1 + math.cos(math.pi * progress))
    return peak * warm * decay


# -- data -------------------------------------------------------------------------------------


class Inputs:
    """One micro-batch on the device: noisy latents, timesteps (0-1000), text, velocity target."""

    __slots__ = ("x_t", "timestep", "text", "target")

    def __init__(self, x_t, timestep, text, target):
        self.x_t, self.timestep, self.text, self.target = x_t, timestep, text, target


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """One generator seed per (run seed, epoch, sample), distinct for epochs and samples
    below a million: every arm draws the same t and noise for a sample."""
    return ((seed * 1_000_003 + epoch) * 1_000_033 + index) % (2**63 - 1)


def modality_of(shape) -> str:
    return "image" if shape[0] == 1 else "clip"


def tokens_of(shape) -> int:
    return math.prod(s // p for s, p in zip(shape, PATCH, strict=True))


class SyntheticMix:
    """Latents of smooth waves: ``x0[c, f, y, x] = sum_j a_j load_j[c] cos(k_j . (p - v_j f) +
    phi_j)``, ``p = (y, x)``, with the waves ``(k_j, v_j, phi_j, load_j)`` of the sample's pattern
    id and random amplitudes ``a_j``; ``v_j = 0`` for images. Image ids are ``[0, P)``, clip ids
    ``[P, 2P)``; the text embedding of a sample is its id's fixed random embedding, the same
    for ids ``i`` and ``P + i`` with ``shared_text``."""

    def __init__(self, setup: Setup, device, seed: int = 1234):
        self.setup, self.device = setup, device
        rng = np.random.default_rng(seed)
        p, j = 2 * setup.patterns, setup.waves
        c = setup.model["in_channels"]
        angle = rng.uniform(0, 2 * np.pi, (p, j))
        k = 2 * np.pi / rng.uniform(*setup.wavelength, (p, j))
        self.k = np.stack([k * np.sin(angle), k * np.cos(angle)], -1)  # (ids, waves, 2)
        heading = rng.uniform(0, 2 * np.pi, (p, j))
        speed = rng.uniform(*setup.speed, (p, j))
        speed[: setup.patterns] = 0.0  # images do not move
        self.v = np.stack([speed * np.sin(heading), speed * np.cos(heading)], -1)
        self.phase = rng.uniform(0, 2 * np.pi, (p, j))
        load = rng.standard_normal((p, j, c))
        self.load = load / np.linalg.norm(load, axis=-1, keepdims=True) * math.sqrt(c)
        text = rng.standard_normal((p, setup.text_len, setup.model["text_dim"]))
        if setup.shared_text:
            text[setup.patterns :] = text[: setup.patterns]
        self.text = torch.tensor(text, dtype=torch.float32, device=device)
        self.seed = seed

    def latents(self, shape, ids, amplitudes) -> torch.Tensor:
        """(n, C, F, H, W) latents of one shape, unit variance on average."""
        dev = self.device

        def on(a):
            return torch.as_tensor(a, dtype=torch.float32, device=dev)

        f, y, x = (torch.arange(n, dtype=torch.float32, device=dev) for n in shape)
        k, kv, phase = on(self.k[ids]), on((self.k * self.v).sum(-1)[ids]), on(self.phase[ids])
        # k . (p - v f) + phi over (n, waves, F, H, W)
        arg = (
            k[..., 0, None, None, None] * y[:, None]
            + k[..., 1, None, None, None] * x
            - kv[..., None, None, None] * f[:, None, None]
            + phase[..., None, None, None]
        )
        x0 = torch.einsum("nj,njc,njfhw->ncfhw", on(amplitudes), on(self.load[ids]), arg.cos())
        return x0 / math.sqrt(self.setup.waves / 2)

    def draw(self, shapes, rng) -> tuple[np.ndarray, np.ndarray]:
        """Pattern ids and wave amplitudes for samples of the given shapes."""
        n, pat = len(shapes), self.setup.patterns
        clip = np.array([modality_of(s) == "clip" for s in shapes], dtype=np.int64)
        return rng.integers(0, pat, n) + pat * clip, rng.standard_normal((n, self.setup.waves))


class TrainSet:
    """The training samples: shape, pattern id and latent of each, stored per shape."""

    def __init__(self, mix: SyntheticMix, n: int):
        rng = np.random.default_rng(mix.seed + 1)
        table = [s for s, _ in mix.setup.mix]
        share = np.array([w for _, w in mix.setup.mix])
        pick = rng.choice(len(table), n, p=share / share.sum())
        self.shapes = np.array([table[i] for i in pick], dtype=np.int64)  # (n, 3)
        self.ids, amplitudes = mix.draw(self.shapes, rng)
        self.seq_lens = np.array([tokens_of(s) for s in self.shapes], dtype=np.int64)
        self.mix = mix
        self.row = np.zeros(n, dtype=np.int64)  # position within its shape's tensor
        self.x0 = {}
        for i, shape in enumerate(table):
            members = np.flatnonzero(pick == i)
            self.row[members] = np.arange(len(members))
            if len(members):
                self.x0[shape] = mix.latents(shape, self.ids[members], amplitudes[members])
        self._gen = torch.Generator(device=mix.device)

    def __len__(self):
        return len(self.seq_lens)

    def is_image(self) -> np.ndarray:
        return self.shapes[:, 0] == 1

    def power(self) -> dict[str, float]:
        """Mean square of the clean latents' elements, per modality."""
        sums = {m: 0.0 for m in MODALITIES}
        counts = {m: 0 for m in MODALITIES}
        for shape, x0 in self.x0.items():
            sums[modality_of(shape)] += float(x0.square().sum())
            counts[modality_of(shape)] += x0.numel()
        return {m: sums[m] / counts[m] for m in MODALITIES}

    def inputs(self, indices, epoch: int, seed: int) -> Inputs:
        """Flow-matching inputs of one micro-batch (one shape: the samplers group by shape)."""
        shape = tuple(int(v) for v in self.shapes[indices[0]])
        dev = self.mix.device
        x0 = self.x0[shape][torch.as_tensor(self.row[indices], device=dev)]
        t = torch.empty(len(indices), device=dev)
        noise = torch.empty_like(x0)
        for b, i in enumerate(indices):  # in place: the same draws in any batch position
            self._gen.manual_seed(sample_seed(seed, epoch, int(i)))
            t[b : b + 1].uniform_(generator=self._gen)
            noise[b].normal_(generator=self._gen)
        tb = t.view(-1, 1, 1, 1, 1)
        text = self.mix.text[torch.as_tensor(self.ids[indices], device=dev)]
        return Inputs((1 - tb) * x0 + tb * noise, t * 1000, text, noise - x0)


class ValSet:
    """A fixed set of images and clips (shapes in turn), each at every t of ``VAL_T``."""

    def __init__(self, mix: SyntheticMix):
        setup = mix.setup
        by_modality = {m: [s for s, _ in setup.mix if modality_of(s) == m] for m in MODALITIES}
        count = {"image": setup.val_images, "clip": setup.val_clips}
        shapes = [
            by_modality[m][i % len(by_modality[m])] for m in MODALITIES for i in range(count[m])
        ]
        ids, amplitudes = mix.draw(shapes, np.random.default_rng(mix.seed + 2))
        gen = torch.Generator().manual_seed(mix.seed + 2)
        self.groups = []  # (modality, Inputs over samples x VAL_T)
        for shape in dict.fromkeys(shapes):
            sel = np.array([s == shape for s in shapes])
            x0 = mix.latents(shape, ids[sel], amplitudes[sel])
            t = torch.tensor(VAL_T, device=mix.device).repeat_interleave(len(x0))
            noise = torch.randn((len(t), *x0.shape[1:]), generator=gen).to(mix.device)
            x0 = x0.repeat(len(VAL_T), 1, 1, 1, 1)
            tb = t.view(-1, 1, 1, 1, 1)
            text = mix.text[torch.as_tensor(ids[sel], device=mix.device)].repeat(len(VAL_T), 1, 1)
            self.groups.append(
                (modality_of(shape), Inputs((1 - tb) * x0 + tb * noise, t * 1000, text, noise - x0))
            )

    @torch.no_grad()
    def loss(self, model) -> dict[str, float]:
        """Mean over samples and timesteps of each sample's mean squared error, per modality."""
        sums = {m: 0.0 for m in MODALITIES}
        counts = {m: 0 for m in MODALITIES}
        for modality, inputs in self.groups:
            err = (forward(model, inputs) - inputs.target).square().flatten(1).mean(1)
            sums[modality] += float(err.sum())
            counts[modality] += len(err)
        return {m: sums[m] / counts[m] for m in MODALITIES if counts[m]}

    def no_structure_loss(self, power: dict[str, float]) -> dict[str, float]:
        """The validation loss of the best predictor that knows no structure: one that takes
        every latent element as independent of the others and of the text, with the
        modality's mean square ``s2`` (``power``). Its best guess of ``v = noise - x0`` from
        ``x_t = (1 - t) x0 + t noise`` is then ``c(t) x_t``, ``c = (t - (1 - t) s2) /
        ((1 - t)^2 s2 + t^2)`` (the linear least-squares estimate, exact for Gaussian
        elements); any loss below it is structure learned."""
        sums = {m: 0.0 for m in MODALITIES}
        counts = {m: 0 for m in MODALITIES}
        for modality, inputs in self.groups:
            s2, t = power[modality], (inputs.timestep / 1000).view(-1, 1, 1, 1, 1)
            c = (t - (1 - t) * s2) / ((1 - t) ** 2 * s2 + t**2)
            err = (c * inputs.x_t - inputs.target).square().flatten(1).mean(1)
            sums[modality] += float(err.sum())
            counts[modality] += len(err)
        return {m: sums[m] / counts[m] for m in MODALITIES if counts[m]}


# -- model and one step -----------------------------------------------------------------------


def forward(model, inputs: Inputs) -> torch.Tensor:
    return model(
        hidden_states=inputs.x_t,
        timestep=inputs.timestep,
        encoder_hidden_states=inputs.text,
        return_dict=False,
    )[0]


def loss_sum(model, inputs: Inputs, normalization: str) -> torch.Tensor:
    """The micro-batch's share of the step's loss before normalization: its squared errors
    summed (``tokens``), or each sample's mean squared error summed (``samples``)."""
    err = (forward(model, inputs).float() - inputs.target).square()
    return err.sum() if normalization == "tokens" else err.flatten(1).mean(1).sum()
