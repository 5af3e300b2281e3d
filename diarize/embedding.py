"""CAM++ as a pyannote.audio `Model`, so pyannote's pipelines can use it as their embedding."""

from __future__ import annotations

import torch
from pyannote.audio import Model

from diarize.campplus import EMBEDDING_DIM, SAMPLE_RATE, CAMPPlus


class CamPlusPlusEmbedding(Model):
    """forward(waveforms (batch, 1, samples), weights (batch, frames) | None) -> (batch, 192).

    `weights` is a per-frame speaker mask at any frame rate (pyannote passes the segmentation
    model's); the network sees the whole waveform and only its statistics pooling is weighted.
    """

    def __init__(self, network: CAMPPlus) -> None:
        super().__init__(sample_rate=SAMPLE_RATE, num_channels=1)
        self.network = network

    @property
    def dimension(self) -> int:
        return EMBEDDING_DIM

    def frame_features(self, waveforms: torch.Tensor) -> torch.Tensor:
        """(batch, 1, samples) -> (batch, 512, frames) at 50 frames/s."""
        return self.network.frame_features(waveforms[:, 0])

    def pool(self, frames: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """frames (batch, 512, T), weights (batch, speakers, W) -> (batch, speakers, 192)."""
        return self.network.pool(frames, weights)

    def forward(self, waveforms: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        frames = self.frame_features(waveforms)
        if weights is None:
            return self.network.pool(frames)[:, 0]
        return self.network.pool(frames, weights[:, None])[:, 0]
