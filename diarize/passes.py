"""The diarizer's two passes over a recording, kept so that other speaker counts cluster
them again without running the networks again.

The embedded pipeline's segmentation pass (who of three local speakers is active, frame by
frame, in each 10 s chunk) and embedding pass (a CAM++ embedding per chunk and local speaker)
do not depend on the speaker counts: only the clustering after them does. Saved as they were
computed (float32; the powerset segmentation's 0/1 activations as bits), they give clustering
exactly the inputs a fresh run would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class SpeakerPasses:
    """segmentations: (chunks, frames, local speakers) activations; chunk_window: the chunks'
    (start, duration, step) in seconds; embeddings: (chunks, local speakers, dimension), NaN
    where a local speaker is silent."""

    segmentations: np.ndarray
    chunk_window: tuple[float, float, float]
    embeddings: np.ndarray

    def cover(self, seconds: float) -> bool:
        """Whether these passes could be over audio of `seconds`: their chunks, one every
        `step` seconds (the last one padded), span it. Passes over other audio (a kept file's,
        made before its clip ranges were diarized apart) are not to be clustered for it."""
        _, duration, step = self.chunk_window
        expected = max(seconds - duration, 0.0) / step + 1
        return abs(len(self.segmentations) - expected) <= 1.5

    def save(self, stream) -> None:
        """Writes the passes to a binary stream (numpy's compressed npz)."""
        binary = bool(np.isin(self.segmentations, (0.0, 1.0)).all())
        stored = np.packbits(self.segmentations.astype(bool)) if binary else self.segmentations
        np.savez_compressed(
            stream,
            segmentations=stored,
            shape=np.array(self.segmentations.shape),
            binary=np.array(binary),
            chunk_window=np.array(self.chunk_window, np.float64),
            embeddings=self.embeddings,
        )

    @classmethod
    def load(cls, stream) -> SpeakerPasses:
        """From a path or binary stream `save` wrote; raises OSError, ValueError or KeyError
        where it holds no passes."""
        with np.load(stream, allow_pickle=False) as stored:
            shape = tuple(int(n) for n in stored["shape"])
            segmentations = stored["segmentations"]
            if bool(stored["binary"]):
                count = int(np.prod(shape))
                segmentations = np.unpackbits(segmentations, count=count).astype(np.float32)
            segmentations = segmentations.reshape(shape).astype(np.float32, copy=False)
            start, duration, step = (float(v) for v in stored["chunk_window"])
            embeddings = stored["embeddings"].astype(np.float32, copy=False)
        if embeddings.ndim != 3 or embeddings.shape[:2] != (shape[0], shape[2]):
            raise ValueError("the embeddings do not match the segmentations")
        return cls(segmentations, (start, duration, step), embeddings)
