"""The data and model of benchmarks/fidelity.py: the sizes (``Size``, ``SIZES``), a seed's
training set and held-out validation set (``SeedData``), the scaled-down
``WanTransformer3DModel`` and one optimizer step's loss over its samples, batched by shape.

**Task.** A latent is a sum of smooth 2-D waves, ``x0[c, f, y, x] = sum_j a_j load_j[c]
cos(k_j . (p - v_j f) + phi_j)``, moving in clips (``v_j != 0``) and still in images. The
waves ``(k_j, v_j, phi_j, load_j)`` are a *pattern*; the text embedding is one token per wave,
a fixed linear map of its parameters, so the model can learn text -> latent for patterns it
never saw. Each seed draws its own training patterns and samples; its validation patterns
are drawn after them from the same stream (ids never trained on) and are scored at
``val_timesteps`` evenly spaced timesteps.

**Scaling.** Shapes keep real latent frame counts (1 for images, 9 and 21 for 33- and
81-frame clips) and shrink height and width, so one token here stands for ``TOKEN_SCALE`` of
Wan 2.1 at 480p/720p; the spread from the shortest image to the longest clip stays above 40x.
The model's width shrinks by about as much (``dim`` ~ 5120 / ``TOKEN_SCALE``), which keeps
attention's share of a block's work at each length near Wan 14B's (``2S / (2S + (6 + 2r) d)``
with ``r`` = ffn / dim), and the sampler plans with Wan 14B's H200 cost model rescaled to
these tokens (``cost_model``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from adaptiveload import CostModel

PATCH = (1, 2, 2)
MODALITIES = ("image", "clip")
# One benchmark token stands for this many of Wan 2.1's (a 480p image: 1,560 tokens, here 24).
TOKEN_SCALE = 65


@dataclass(frozen=True)
class Size:
    """Model, data and schedule of one benchmark size."""

    #: WanTransformer3DModel keyword arguments (patch (1, 2, 2) besides)
    model: dict
    #: ((frames, height, width) of the latent, share of samples); one frame: an image
    mix: tuple
    #: training samples per seed (fresh each seed), and the patterns they are drawn from
    samples: int
    patterns: int
    #: held-out validation patterns per shape, each at every one of ``val_timesteps``
    val_per_shape: int
    val_timesteps: int
    #: optimizer steps of every run (the same for every arm and ranks count), evaluations
    steps: int
    evals: int
    #: AdamW peak learning rate; linear warm-up over ``warmup`` of the steps, then cosine
    #: decay to ``final_lr`` times the peak
    lr: float
    warmup: float = 0.1
    final_lr: float = 0.1
    waves: int = 2
    #: wavelengths (latent pixels) and clip speeds (latent pixels per frame)
    wavelength: tuple = (3.0, 8.0)
    speed: tuple = (0.5, 1.5)


# Latent shapes: a 480p and a 720p image, 33 frames at 480p, 81 frames at 720p (Wan 2.1:
# 1,560 / 3,600 / 14,040 / 75,600 tokens), here 24 / 60 / 216 / 1,260 tokens (52.5x).
_MIX = (
    ((1, 8, 12), 0.35),
    ((1, 12, 20), 0.20),
    ((9, 8, 12), 0.30),
    ((21, 12, 20), 0.15),
)
# dim 80 = 5120 / 64, ffn 2.7x as Wan's: attention is ~5% of an image's work, ~75% of the
# longest clip's (Wan 14B: 6%, 75%).
_MODEL = dict(
    num_attention_heads=2,
    attention_head_dim=40,
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=64,
    ffn_dim=216,
    num_layers=2,
)
SIZES = {
    "full": Size(
        model=_MODEL,
        mix=_MIX,
        samples=8192,
        patterns=1024,
        val_per_shape=8,
        val_timesteps=16,
        steps=100,
        evals=4,
        lr=2e-3,
    ),
    # CPU, seconds: the wiring check of the tests (one block of 2 heads of 8).
    "quick": Size(
        model=dict(
            _MODEL, attention_head_dim=8, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1
        ),
        mix=(((1, 4, 4), 0.35), ((1, 4, 6), 0.2), ((3, 4, 6), 0.3), ((9, 4, 8), 0.15)),
        samples=96,
        patterns=16,
        val_per_shape=1,
        val_timesteps=4,
        steps=6,
        evals=2,
        lr=2e-3,
    ),
}


def learning_rate(size: Size, step: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``size.steps``: linear warm-up,
    then cosine decay. By step alone, so every arm of a setup follows the same schedule."""
    progress = step / size.steps
    warm = min(1.0, (step + 1) / (size.warmup * size.steps)) if size.warmup > 0 else 1.0
    decay = size.final_lr + (1 - size.final_lr) * 0.5 * (1 + math.cos(math.pi * progress))
    return size.lr * warm * decay


def cost_model() -> CostModel:
    """Wan 2.1 14B's H200 block profile (``CostModel.wan21_h200``) with its token terms rescaled
    to benchmark tokens: ``c1 * TOKEN_SCALE``, ``c2 * TOKEN_SCALE**2``. Plans then weigh a
    benchmark micro-batch as Wan weighs the one it stands for."""
    d, s = CostModel.wan21_h200("14B").to_dict(), TOKEN_SCALE
    kept = d["split_kept"]
    return CostModel.polynomial(
        d["c0"], d["c1"] * s, d["c2"] * s * s, per_sample=d["per_sample"]
    ).with_split_kept(kept["k0"], kept["k1"] * s)


def tokens_of(shape) -> int:
    return math.prod(s // p for s, p in zip(shape, PATCH, strict=True))


def modality_of(shape) -> str:
    return "image" if shape[0] == 1 else "clip"


# -- data -------------------------------------------------------------------------------------

# Streams of a seed's generator: patterns and samples, validation, noise of an epoch.
_DATA, _VAL, _NOISE = 0, 1, 2
# The fixed text encoder: a random linear map of a wave's parameters (the same for every seed).
_TEXT_ENCODER_SEED = 54


class Patterns:
    """Wave parameters of ``n`` patterns of one modality, and their text (one token per wave)."""

    def __init__(self, size: Size, n: int, clip: bool, rng: np.random.Generator):
        j, c = size.waves, size.model["in_channels"]
        angle = rng.uniform(0, 2 * np.pi, (n, j))
        k = 2 * np.pi / rng.uniform(*size.wavelength, (n, j))
        self.k = np.stack([k * np.sin(angle), k * np.cos(angle)], -1)  # (n, waves, 2)
        heading = rng.uniform(0, 2 * np.pi, (n, j))
        speed = rng.uniform(*size.speed, (n, j)) if clip else np.zeros((n, j))
        self.v = np.stack([speed * np.sin(heading), speed * np.cos(heading)], -1)
        self.phase = rng.uniform(0, 2 * np.pi, (n, j))
        load = rng.standard_normal((n, j, c))
        self.load = load / np.linalg.norm(load, axis=-1, keepdims=True) * math.sqrt(c)
        features = np.concatenate(
            [self.k, self.v, np.cos(self.phase)[..., None], np.sin(self.phase)[..., None], load],
            -1,
        )
        encoder = np.random.default_rng(_TEXT_ENCODER_SEED).standard_normal(
            (features.shape[-1], size.model["text_dim"])
        )
        self.text = features @ encoder / math.sqrt(features.shape[-1])  # (n, waves, text_dim)

    def params(self) -> np.ndarray:
        """One row per pattern: every parameter (to tell patterns apart)."""
        n = len(self.k)
        return np.concatenate([a.reshape(n, -1) for a in (self.k, self.v, self.phase)], 1)


def latents(p: Patterns, ids, amplitudes, shape, waves: int, device) -> torch.Tensor:
    """(n, C, F, H, W) latents of patterns ``ids`` of ``p``, unit variance on average."""

    def on(a):
        return torch.as_tensor(a, dtype=torch.float32, device=device)

    f, y, x = (torch.arange(s, dtype=torch.float32, device=device) for s in shape)
    k, kv = on(p.k[ids]), on((p.k * p.v).sum(-1)[ids])
    arg = (  # k . (p - v f) + phi over (n, waves, F, H, W)
        k[..., 0, None, None, None] * y[:, None]
        + k[..., 1, None, None, None] * x
        - kv[..., None, None, None] * f[:, None, None]
        + on(p.phase[ids])[..., None, None, None]
    )
    x0 = torch.einsum("nj,njc,njfhw->ncfhw", on(amplitudes), on(p.load[ids]), arg.cos())
    return x0 / math.sqrt(waves / 2)


@dataclass
class Batch:
    """One shape's samples of a step, or of the validation set, on the device."""

    x_t: torch.Tensor
    timestep: torch.Tensor  # 0-1000
    text: torch.Tensor
    target: torch.Tensor  # the velocity noise - x0


class SeedData:
    """A seed's training set (``samples`` drawn from ``patterns`` training patterns per
    modality) and validation set (``val_per_shape`` new patterns per shape, each at every
    timestep ``(i + 0.5) / val_timesteps``), on the device."""

    def __init__(self, size: Size, seed: int, device):
        self.size, self.seed, self.device = size, seed, torch.device(device)
        rng = np.random.default_rng([seed, _DATA])
        table = [s for s, _ in size.mix]
        share = np.array([w for _, w in size.mix])
        self.patterns = {m: Patterns(size, size.patterns, m == "clip", rng) for m in MODALITIES}
        pick = rng.choice(len(table), size.samples, p=share / share.sum())
        self.shapes = np.array([table[i] for i in pick], dtype=np.int64)  # (n, 3)
        self.seq_lens = np.array([tokens_of(s) for s in self.shapes], dtype=np.int64)
        self.pattern_ids = rng.integers(0, size.patterns, size.samples)
        amplitudes = rng.standard_normal((size.samples, size.waves))
        self.row = np.zeros(size.samples, dtype=np.int64)  # place in its shape's tensors
        self.x0, self.text = {}, {}
        for i, shape in enumerate(table):
            members = np.flatnonzero(pick == i)
            self.row[members] = np.arange(len(members))
            p = self.patterns[modality_of(shape)]
            ids = self.pattern_ids[members]
            self.x0[shape] = latents(p, ids, amplitudes[members], shape, size.waves, device)
            self.text[shape] = torch.tensor(p.text[ids], dtype=torch.float32, device=device)
        self.val_patterns = {m: None for m in MODALITIES}
        self.val = self._validation(table, np.random.default_rng([seed, _VAL]))
        self._epoch, self._noise = None, {}

    def __len__(self) -> int:
        return len(self.seq_lens)

    def is_image(self) -> np.ndarray:
        return self.shapes[:, 0] == 1

    def _validation(self, table, rng) -> list[tuple[str, Batch]]:
        size, out = self.size, []
        n = size.val_per_shape
        for m in MODALITIES:
            shapes = [s for s in table if modality_of(s) == m]
            self.val_patterns[m] = Patterns(size, n * len(shapes), m == "clip", rng)
        t = (torch.arange(size.val_timesteps, device=self.device) + 0.5) / size.val_timesteps
        t = t.repeat_interleave(n)
        for m in MODALITIES:
            shapes = [s for s in table if modality_of(s) == m]
            for i, shape in enumerate(shapes):
                ids = np.arange(i * n, (i + 1) * n)
                p = self.val_patterns[m]
                x0 = latents(p, ids, rng.standard_normal((n, size.waves)), shape, size.waves, "cpu")
                x0 = x0.repeat(size.val_timesteps, 1, 1, 1, 1).to(self.device)
                noise = torch.tensor(rng.standard_normal(x0.shape), dtype=torch.float32)
                noise = noise.to(self.device)
                text = torch.tensor(p.text[ids], dtype=torch.float32, device=self.device)
                tb = t.view(-1, 1, 1, 1, 1)
                out.append(
                    (
                        m,
                        Batch(
                            (1 - tb) * x0 + tb * noise,
                            t * 1000,
                            text.repeat(size.val_timesteps, 1, 1),
                            noise - x0,
                        ),
                    )
                )
        return out

    def _draw_noise(self, epoch: int) -> None:
        """Every sample's timestep and noise for ``epoch``, per shape: the same draws for a
        sample in every arm, whatever step it lands in."""
        if self._epoch == epoch:
            return
        gen = torch.Generator(device=self.device)
        self._noise = {}
        for i, (shape, x0) in enumerate(self.x0.items()):
            state = np.random.SeedSequence([self.seed, _NOISE, epoch, i]).generate_state(1)
            gen.manual_seed(int(state[0]))
            t = torch.rand(len(x0), generator=gen, device=self.device)
            self._noise[shape] = (t, torch.randn(x0.shape, generator=gen, device=self.device))
        self._epoch = epoch

    def batches(self, samples: np.ndarray, epoch: int) -> list[Batch]:
        """The flow-matching inputs of a step's samples (padding repeats included), one batch
        per shape."""
        self._draw_noise(epoch)
        out = []
        shapes = self.shapes[samples]
        for shape in self.x0:
            members = samples[(shapes == shape).all(axis=1)]
            if not len(members):
                continue
            rows = torch.as_tensor(self.row[members], device=self.device)
            x0 = self.x0[shape][rows]
            t, noise = (v[rows] for v in self._noise[shape])
            tb = t.view(-1, 1, 1, 1, 1)
            out.append(
                Batch((1 - tb) * x0 + tb * noise, t * 1000, self.text[shape][rows], noise - x0)
            )
        return out


# -- model and one step -----------------------------------------------------------------------


def build_model(size: Size, seed: int, device):
    """A randomly initialized WanTransformer3DModel, the same for the same seed on any device
    (initialized on the CPU, without touching the global generator)."""
    from diffusers import WanTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = WanTransformer3DModel(patch_size=PATCH, **size.model)
    return model.to(device).train()


def forward(model, batch: Batch) -> torch.Tensor:
    with torch.autocast(batch.x_t.device.type, torch.bfloat16, enabled=batch.x_t.is_cuda):
        out = model(
            hidden_states=batch.x_t,
            timestep=batch.timestep,
            encoder_hidden_states=batch.text,
            return_dict=False,
        )[0]
    return out.float()


def step_loss_backward(model, batches: list[Batch]) -> torch.Tensor:
    """Forward+backward of a step's samples, one batch per shape, accumulating the gradient of
    the step's squared error summed over every latent element and divided by their number: the
    gradient DDP averages over ranks times W, with each micro-batch's loss summed over tokens
    and scaled by ``MicroBatch.loss_scale(W)``. Micro-batch boundaries do not enter it, so a
    step's samples run batched by shape. Returns the step's loss (on the device, unsynchronized)."""
    elements = sum(b.target.numel() for b in batches)
    total = torch.zeros((), device=batches[0].target.device)
    for b in batches:
        loss = (forward(model, b) - b.target).square().sum() / elements
        loss.backward()
        total += loss.detach()
    return total


@torch.no_grad()
def validation_loss(model, data: SeedData) -> dict[str, float]:
    """Per modality, the mean over held-out samples and timesteps of each one's mean squared
    error per latent element."""
    sums = {m: 0.0 for m in MODALITIES}
    counts = {m: 0 for m in MODALITIES}
    for m, b in data.val:
        err = (forward(model, b) - b.target).square().flatten(1).mean(1)
        sums[m] += float(err.sum())
        counts[m] += len(err)
    return {m: sums[m] / counts[m] for m in MODALITIES}
