"""CAM++ speaker embedding network (Wang et al., "CAM++: A Fast and Efficient Network for
Speaker Verification Using Context-Aware Masking", Interspeech 2023), written so that the
3D-Speaker checkpoint `campplus_cn_en_common.pt` (192-d, 16 kHz, Apache-2.0) loads as is.

Shape of the network, input (batch, frames, 80) log-mel filterbanks at 100 frames/s:
  FCM head: a 2-D ResNet over (frequency, time) that strides frequency only, 80 -> 10 bins of
    32 channels -> (batch, 320, frames);
  D-TDNN trunk: one TDNN layer striding time by 2 (50 frames/s), three densely connected
    blocks of context-aware-masking layers (12, 24, 16 layers; growth 32) with halving
    transitions -> (batch, 512, frames / 2);
  statistics pooling (mean and standard deviation over time) -> (batch, 1024), then a linear
    layer and an affine-free batch norm -> (batch, 192).

`frame_features` and `pool` are split so that one pass over a chunk of audio serves every
speaker in it: the diarization pipeline pools the same frames under each speaker's mask.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from asr.audio import SAMPLE_RATE  # CAM++'s rate, the one every audio path delivers

NUM_MEL_BINS = 80
EMBEDDING_DIM = 192
CHECKPOINT = "campplus_cn_en_common.pt"
FRAME_SHIFT = 0.02  # seconds between output frames: 10 ms filterbank shift, time stride 2
# The level (RMS, full scale 1) every waveform is brought to before its filterbanks. Log-mel
# energies are floored at float32's epsilon, which digital silence and a band the recording
# leaves empty (telephone audio above 4 kHz) reach: the floored values stay where they are
# while the others move with the level, so even after mean normalisation the features, and
# with them the clustering, changed with a gain. The telephone pyannote_sample found its two
# speakers at its own level and lost one 3 dB louder (a stereo file of two identical
# channels). 0.01, about the level of ../shared/speech/multi's recordings: their turns are
# the same as at their own levels (`python -m bench.diarize`).
INPUT_RMS = 0.01


def num_frames(num_samples: int) -> int:
    """Output frames of `frame_features` for `num_samples` samples (499 for 10 s)."""
    filterbank_frames = 1 + (num_samples - 400) // 160  # 25 ms windows, 10 ms shift
    return (filterbank_frames - 1) // 2 + 1


def _bn_relu(channels: int) -> nn.Sequential:
    # Named as in the checkpoint: `<prefix>.batchnorm.weight`.
    return nn.Sequential(
        OrderedDict([("batchnorm", nn.BatchNorm1d(channels)), ("relu", nn.ReLU(inplace=True))])
    )


class _ResBlock(nn.Module):
    """2-D residual block; `stride` applies to the frequency axis only."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=(stride, 1), bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class _FCM(nn.Module):
    """Front-end convolution module: (batch, 80, frames) -> (batch, 320, frames)."""

    def __init__(self, channels: int = 32, feat_dim: int = NUM_MEL_BINS) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layer1 = nn.Sequential(
            _ResBlock(channels, channels, 2), _ResBlock(channels, channels, 1)
        )
        self.layer2 = nn.Sequential(
            _ResBlock(channels, channels, 2), _ResBlock(channels, channels, 1)
        )
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.out_channels = channels * (feat_dim // 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        out = self.layer2(self.layer1(out))
        out = F.relu(self.bn2(self.conv2(out)))
        batch, channels, bins, frames = out.shape
        return out.reshape(batch, channels * bins, frames)


class _TDNN(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(
            in_ch, out_ch, kernel, stride=stride, padding=(kernel - 1) // 2, bias=False
        )
        self.nonlinear = _bn_relu(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


class _CAMLayer(nn.Module):
    """A local TDNN output scaled by a sigmoid mask computed from utterance-level and
    100-frame segment-level context (the paper's context-aware masking)."""

    SEGMENT = 100  # frames

    def __init__(self, in_ch: int, out_ch: int, kernel: int, dilation: int) -> None:
        super().__init__()
        padding = (kernel - 1) // 2 * dilation
        self.linear_local = nn.Conv1d(
            in_ch, out_ch, kernel, padding=padding, dilation=dilation, bias=False
        )
        self.linear1 = nn.Conv1d(in_ch, in_ch // 2, 1)
        self.linear2 = nn.Conv1d(in_ch // 2, out_ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        segments = F.avg_pool1d(x, self.SEGMENT, self.SEGMENT, ceil_mode=True)
        segment_context = segments.repeat_interleave(self.SEGMENT, dim=-1)[..., :frames]
        context = x.mean(-1, keepdim=True) + segment_context
        mask = torch.sigmoid(self.linear2(F.relu(self.linear1(context))))
        return self.linear_local(x) * mask


class _DenseLayer(nn.Module):
    """BN-ReLU, 1x1 bottleneck to 128, BN-ReLU, CAM layer to `growth` new channels."""

    def __init__(self, in_ch: int, growth: int, bottleneck: int, kernel: int, dilation: int):
        super().__init__()
        self.nonlinear1 = _bn_relu(in_ch)
        self.linear1 = nn.Conv1d(in_ch, bottleneck, 1, bias=False)
        self.nonlinear2 = _bn_relu(bottleneck)
        self.cam_layer = _CAMLayer(bottleneck, growth, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))


class _DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, in_ch: int, growth: int, kernel: int, dilation: int):
        super().__init__(
            {
                f"tdnnd{i + 1}": _DenseLayer(
                    in_ch + i * growth, growth, 4 * growth, kernel, dilation
                )
                for i in range(layers)
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.values():
            x = torch.cat([x, layer(x)], dim=1)
        return x


class _Transit(nn.Module):
    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.nonlinear = _bn_relu(in_ch)
        self.linear = nn.Conv1d(in_ch, out_ch, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class _Dense(nn.Module):
    """Embedding layer: 1x1 projection then batch norm without affine parameters."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(in_ch, out_ch, 1, bias=False)
        self.nonlinear = nn.Sequential(
            OrderedDict([("batchnorm", nn.BatchNorm1d(out_ch, affine=False))])
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x.unsqueeze(-1))).squeeze(-1)


class _XVector(nn.Module):
    def __init__(self, in_ch: int, embedding_dim: int) -> None:
        super().__init__()
        self.tdnn = _TDNN(in_ch, 128, kernel=5, stride=2)
        channels = 128
        for index, (layers, dilation) in enumerate(((12, 1), (24, 2), (16, 2)), start=1):
            self.add_module(f"block{index}", _DenseBlock(layers, channels, 32, 3, dilation))
            channels += layers * 32
            self.add_module(f"transit{index}", _Transit(channels, channels // 2))
            channels //= 2
        self.out_nonlinear = _bn_relu(channels)
        self.dense = _Dense(2 * channels, embedding_dim)
        self.channels = channels

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tdnn(x)
        for index in (1, 2, 3):
            x = getattr(self, f"transit{index}")(getattr(self, f"block{index}")(x))
        return self.out_nonlinear(x)


class CAMPPlus(nn.Module):
    """CAM++ with the 3D-Speaker hyper-parameters (FCM 32 channels, growth 32, 192-d)."""

    def __init__(self, embedding_dim: int = EMBEDDING_DIM) -> None:
        super().__init__()
        self.head = _FCM()
        self.xvector = _XVector(self.head.out_channels, embedding_dim)
        self.embedding_dim = embedding_dim

    @staticmethod
    def fbank(waveforms: torch.Tensor) -> torch.Tensor:
        """waveforms (batch, samples) float in [-1, 1] at 16 kHz -> (batch, frames, 80).

        Kaldi-style log-mel filterbanks (25 ms Povey window, 10 ms shift, no dither), centred
        on their mean over time, as the checkpoint was trained, of each waveform brought to
        `INPUT_RMS`: the same features whatever the recording's gain.
        """
        from torchaudio.compliance import kaldi

        levels = waveforms.pow(2).mean(dim=1, keepdim=True).sqrt()
        waveforms = waveforms * (INPUT_RMS / levels.clamp(min=1e-9))  # silence stays 0

        features = torch.stack(
            [
                kaldi.fbank(
                    waveform[None],
                    num_mel_bins=NUM_MEL_BINS,
                    sample_frequency=SAMPLE_RATE,
                    dither=0.0,
                )
                for waveform in waveforms
            ]
        )
        return features - features.mean(dim=1, keepdim=True)

    def frame_features(self, waveforms: torch.Tensor) -> torch.Tensor:
        """waveforms (batch, samples) -> frame-level features (batch, 512, frames), 50 frames/s."""
        features = self.fbank(waveforms).transpose(1, 2)  # (batch, 80, frames)
        return self.xvector.trunk(self.head(features))

    def pool(self, frames: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """frames (batch, 512, T) and weights (batch, speakers, W) -> (batch, speakers, 192).

        Weighted mean and standard deviation over time, one pair per speaker. `weights` are
        masks in [0, 1] at any frame rate that cover the same span as `frames`; None weighs
        every frame 1 (speakers = 1), the checkpoint's own statistics pooling. A speaker whose
        weights are all 0 gets a NaN embedding.
        """
        batch, _, length = frames.shape
        if weights is None:
            weights = frames.new_ones(batch, 1, length)
        else:
            # Nearest-neighbour resampling keeps a 0/1 mask binary.
            weights = F.interpolate(weights.to(frames.dtype), size=length, mode="nearest")
        # float64: the variance below is a difference of two moments.
        frames, weights = frames.double(), weights.double()
        total = weights.sum(-1, keepdim=True)  # (batch, speakers, 1)
        mean = torch.einsum("bdt,bst->bsd", frames, weights) / total
        second = torch.einsum("bdt,bst->bsd", frames.square(), weights) / total
        # Unbiased, as the checkpoint was trained with torch.std.
        variance = (second - mean.square()).clamp_min(0) * total / (total - 1).clamp_min(1)
        stats = torch.cat([mean, variance.clamp_min(1e-10).sqrt()], dim=-1).float()
        speakers = stats.shape[1]
        return self.xvector.dense(stats.flatten(0, 1)).unflatten(0, (batch, speakers))

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        """waveforms (batch, samples) float at 16 kHz -> embeddings (batch, 192)."""
        return self.pool(self.frame_features(waveforms))[:, 0]


def load_campplus(directory: str | Path) -> CAMPPlus:
    """The network in eval mode, weights from `directory/campplus_cn_en_common.pt` (strict)."""
    state = torch.load(Path(directory) / CHECKPOINT, map_location="cpu", weights_only=True)
    model = CAMPPlus()
    model.load_state_dict(state, strict=True)
    return model.eval()
