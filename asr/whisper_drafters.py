"""Drafts for a target Whisper: draft Whispers paired in one of three ways, checked once when
the pair is made, and prompt lookup, which needs no model.

- "shared-encoder": the draft's decoder attends to the TARGET's encoder output (distil-whisper:
  a decoder-only WhisperForCausalLM, or a WhisperForConditionalGeneration whose encoder is the
  target's); nothing is encoded twice.
- "own-encoder": a full Whisper with the target's vocabulary; its encoder runs once per window.
- "cross-tokenizer": a full Whisper with another vocabulary (whisper-tiny.en for a multilingual
  target); committed tokens travel as text with special tokens mapped by meaning
  (`asr.whisper_text`), and the draft gets its own SOT sequence.

Every draft decodes through `WhisperTarget`, so it sees its own vocabulary's logit rules, as the
target sees its own. An incompatible pair raises ValueError naming both models.

`LookupDraft` ("prompt-lookup") drafts what followed the window's last text tokens where
they occur earlier in its prompt (the previous windows' text) or its own output, at no model
cost: it pays on repeated phrases and names, and the adaptive policy stops drafting where it
does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from asr.logit_rules import DRAFT_GRAMMAR, LogitRules
from asr.whisper import EncodedAudio, WhisperModel
from asr.whisper_target import WhisperTarget
from asr.whisper_text import WhisperTextCodec
from decoding import (
    Adaptive,
    ConstantK,
    CrossTokenizerDrafter,
    Drafter,
    LookaheadPolicy,
    LookupBranchDrafter,
    ModelDrafter,
    PromptLookupDrafter,
)

# Encoder frames of padding a draft attends to after a window's audio (WhisperDraft.encode):
# 2 s, where Whisper places a segment's closing timestamp.
DRAFT_PADDING_FRAMES = 100

# The shortest repeated n-gram whose continuation a lookup branch proposes instead of the
# draft's next-best chain: a single recurring token ("the") predicts worse than the draft's
# second choice (bench.cli's 59 files, int8, two chains: 2.60 tokens per call at 1, 2.63 at 2
# and 3, 2.63 with no lookup branch; docs/drafts.md).
LOOKUP_BRANCH_NGRAM = 2

# Tokens a shared-encoder draft proposes per block (`WhisperDraft.default_policy`).
SHARED_ENCODER_BLOCK = 3

DraftPairing = Literal["shared-encoder", "own-encoder", "cross-tokenizer"]
"""How a draft Whisper works with its target: whose encoder it reads, and whether committed
tokens must travel to it as text (see the module docstring)."""
DRAFT_PAIRINGS: tuple[DraftPairing, ...] = ("shared-encoder", "own-encoder", "cross-tokenizer")


@dataclass(frozen=True)
class WhisperDraft:
    """A draft Whisper paired with a target; make it with `pair_draft`."""

    target: WhisperModel
    model: WhisperModel
    pairing: DraftPairing
    # Chains per drafted block, from the draft's best first tokens (a tree verified in one
    # target call: `decoding.generate`'s branches). 1: one chain.
    branches: int = 1
    # The last of those chains follows prompt lookup (`decoding.LookupBranchDrafter`) where the
    # window's text repeats, and the draft's branches-th best first token elsewhere; needs
    # branches >= 2.
    lookup_branch: bool = False

    def __post_init__(self) -> None:
        if self.lookup_branch and self.branches < 2:
            raise ValueError(
                f"a lookup branch is the last chain of a tree: it needs at least 2 draft "
                f"branches (got {self.branches})"
            )

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def needs_mel(self) -> bool:
        """Whether the draft reads a log-mel of its own (it has an encoder of its own)."""
        return self.pairing != "shared-encoder"

    def encode(
        self,
        target_encoded: EncodedAudio,
        mel: torch.Tensor | None,
        audio_frames: int | None = None,
    ) -> EncodedAudio:
        """The draft's view of a batch of windows, computed once per window.

        target_encoded: the target's EncodedAudio for these windows.
        mel: Tensor, shape = (batch, draft n_mels, 3000); the draft's log-mel of the same
        windows (unused by a shared-encoder draft).
        audio_frames: encoder frames (50 a second) holding audio in the longest of these
        windows, the rest being the 30 s window's padding, or None. Given, the draft attends
        to them and DRAFT_PADDING_FRAMES more, not to all 1500: a draft only proposes, so it
        need not see what the target sees, and on short windows cross-attention is most of its
        attention's price (docs/drafts.md, "What a faster draft needs"). Ignored where the
        draft's steps run on static buffers of all 1500 frames (`WhisperModel.static_steps`).
        """
        if self.pairing == "shared-encoder":
            layers = self.model.cross_from_target
            if layers is not None:  # a distilled draft: the target's projections, reused
                cross = tuple(target_encoded.cross[layer] for layer in layers)
                view = EncodedAudio(features=target_encoded.features, cross=cross)
            else:
                view = self.model.cross_attention(target_encoded.features)
        elif mel is None:
            raise ValueError(f"draft {self.model.name} has its own encoder and needs a mel")
        else:
            view = self.model.cross_attention(self.model.encode(mel))
        if audio_frames is None or self.model.static_steps:
            return view
        return view.first_frames(audio_frames + DRAFT_PADDING_FRAMES)

    def default_policy(self) -> LookaheadPolicy:
        """The draft-length policy a transcription uses unless given one; a fresh one each time.

        A shared-encoder draft (a distilled one, distil-whisper) on a CPU drafts
        SHARED_ENCODER_BLOCK tokens every block: its step costs a fifth of a target step, and its
        acceptance grows along a block (about 0.68, 0.71, 0.84, 0.86 at the first four
        positions on users' benchmark), so blocks of 3 or 4 pay wherever a window goes.
        `Adaptive`, which estimates both from a few dozen blocks, kept choosing blocks of 1-2
        there and cut the int8 decoder phase 1.14x and 1.25x against 1.33x and 1.34x for
        blocks of 3 (two runs; docs/drafts.md, "Draft-length policies"). Drafts with their own
        encoder or another tokenizer cost more per step and may not pay at all, nor may any
        draft on a GPU, where a step's price is mostly kernel launches, so that a 2-layer draft
        step costs a good part of a 6-layer target step (docs/gpu.md); `Adaptive` finds that
        out and then decodes plainly."""
        if self.pairing == "shared-encoder" and self.model.device.type == "cpu":
            return ConstantK(SHARED_ENCODER_BLOCK)
        return Adaptive()

    def drafter(
        self,
        encoded: EncodedAudio,
        language: str | None,
        task: str,
        timestamps: bool,
        group: int = 1,
    ) -> Drafter:
        """A Drafter for one batch of windows (rows in the target's order), `group` rows per
        window (a drafted tree's chains)."""
        draft = self.model
        rules = LogitRules(draft.special, draft.suppress_tokens, timestamps=timestamps)
        same_vocabulary = self.pairing != "cross-tokenizer"
        model = WhisperTarget(
            draft,
            encoded,
            rules,
            measure_no_speech=False,
            exact=False,
            group=group,
            store_padding=draft.device.type == "cpu",  # where its blocks are traced steps
            # A draft in another vocabulary keeps its grammar: its text is translated.
            grammar=DRAFT_GRAMMAR or not same_vocabulary,
        )
        if same_vocabulary:
            drafter = ModelDrafter(model)
        else:
            target_codec = WhisperTextCodec(self.target, language, task)
            draft_codec = WhisperTextCodec(draft, _draft_language(draft, language), task)
            drafter = CrossTokenizerDrafter(
                ModelDrafter(model),
                target_codec.encode,
                target_codec.decode,
                draft_codec.encode,
                draft_codec.decode,
            )
        if self.lookup_branch and group > 1:
            lookup = WhisperLookupDrafter(self.target.special.eot, min_ngram=LOOKUP_BRANCH_NGRAM)
            return LookupBranchDrafter(drafter, lookup, group)
        return drafter


LOOKUP = "prompt-lookup"  # the --assistant name of LookupDraft


class WhisperLookupDrafter(PromptLookupDrafter):
    """Prompt lookup over a Whisper row's text tokens: special and timestamp tokens (the prompt's
    start-of-transcript sequence, segment times) are left out of both the n-grams and the
    proposals, so the previous windows' text and this window's text read as one stream. Nothing
    is proposed right after a timestamp, where the text that follows is not a continuation."""

    def __init__(self, eot: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        super().__init__(max_ngram, min_ngram)
        self.eot = eot  # every id from here up is special or a timestamp

    def _lookup(self, sequence: torch.Tensor, k: int) -> torch.Tensor:
        if not len(sequence) or int(sequence[-1]) >= self.eot:
            return sequence[:0]
        return super()._lookup(sequence[sequence < self.eot], k)


@dataclass(frozen=True)
class LookupDraft:
    """Prompt lookup for `target`: the same interface as WhisperDraft, with no model."""

    target: WhisperModel
    max_ngram: int = 3

    name = LOOKUP
    pairing = LOOKUP
    needs_mel = False
    branches = 1  # one chain: lookup has no second-best proposal

    def encode(
        self,
        target_encoded: EncodedAudio,
        mel: torch.Tensor | None,
        audio_frames: int | None = None,
    ) -> None:
        """Nothing to encode."""

    def default_policy(self) -> LookaheadPolicy:
        """`Adaptive`: lookup costs nothing to run, but where the text does not repeat it
        proposes nothing worth verifying, and Adaptive then decodes plainly."""
        return Adaptive()

    def drafter(
        self, encoded: None, language: str | None, task: str, timestamps: bool, group: int = 1
    ) -> WhisperLookupDrafter:
        return WhisperLookupDrafter(self.target.special.eot, self.max_ngram)


DraftSource = WhisperDraft | LookupDraft


def _draft_language(draft: WhisperModel, language: str | None) -> str | None:
    """An English-only draft has no language token; a multilingual one gets the target's."""
    if not draft.special.multilingual:
        return None
    return language if language in draft.special.language_ids else "en"


def load_draft(
    target: WhisperModel,
    path: str,
    pairing: DraftPairing | None = None,
    int8: bool | None = None,
) -> WhisperDraft:
    """Loads a draft from a model directory or hub id and pairs it with `target`; a distilled
    draft (asr.draft_checkpoint) borrows the target's embeddings.

    int8: run a distilled draft's decoder layers and head in int8 (`asr.precision.quantize_draft`);
    None: when it runs in float32 on CPU. The output stays the target's either way; only the
    speed changes.
    """
    from asr.draft_checkpoint import is_distilled_draft
    from asr.precision import int8_draft_supported, quantize_draft

    if is_distilled_draft(path):
        draft = WhisperModel.load_draft(path, target)
        # A bf16 target's draft stays in bf16.
        quantize = int8_draft_supported(draft) if int8 is None else int8
        if quantize:
            quantize_draft(draft)
        # It reads the target's cross-attention keys and values: in their dtype, uncopied.
        draft.attention_dtype_override = target.attention_dtype
    else:
        draft = WhisperModel.load(path, target.device, target.dtype)
    return pair_draft(target, draft, pairing)


def pair_draft(
    target: WhisperModel, draft: WhisperModel, pairing: DraftPairing | None = None
) -> WhisperDraft:
    """Checks that `draft` can draft for `target` in `pairing`; None picks the cheapest one:
    cross-tokenizer when the vocabularies differ, shared-encoder when the draft has no encoder
    or the target's, otherwise own-encoder."""
    same_vocabulary = _same_vocabulary(target, draft)
    if pairing is None:
        if not same_vocabulary:
            pairing = "cross-tokenizer"
        elif not draft.has_encoder or _same_encoder(target, draft):
            pairing = "shared-encoder"
        else:
            pairing = "own-encoder"
    pair = f"draft {draft.name} for target {target.name}"
    if pairing not in DRAFT_PAIRINGS:
        raise ValueError(
            f"{pair}: pairing must be one of {', '.join(DRAFT_PAIRINGS)}, not {pairing!r}"
        )
    if pairing != "cross-tokenizer" and not same_vocabulary:
        raise ValueError(
            f"{pair}: the vocabularies differ; use the cross-tokenizer pairing to draft across them"
        )
    if pairing == "shared-encoder":
        _check_shared_encoder(target, draft, pair)
    elif not draft.has_encoder:
        raise ValueError(f"{pair}: a decoder-only draft can only use the target's encoder")
    return WhisperDraft(target=target, model=draft, pairing=pairing)


def _check_shared_encoder(target: WhisperModel, draft: WhisperModel, pair: str) -> None:
    """The draft's cross-attention must read the target's encoder output as it was trained to."""
    for field in ("d_model", "num_mel_bins", "max_source_positions"):
        ours, theirs = getattr(target.config, field), getattr(draft.config, field)
        if ours != theirs:
            raise ValueError(
                f"{pair}: cannot share the target's encoder, {field} differs "
                f"({theirs} in the draft, {ours} in the target)"
            )
    if draft.has_encoder and not _same_encoder(target, draft):
        raise ValueError(
            f"{pair}: the draft's encoder differs from the target's, so its decoder cannot read "
            "the target's encoder output; use the own-encoder pairing"
        )


def _same_vocabulary(target: WhisperModel, draft: WhisperModel) -> bool:
    return (
        target.config.vocab_size == draft.config.vocab_size
        and target.special == draft.special
        and (
            target.tokenizer.digest == draft.tokenizer.digest
            or target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
        )
    )


def _same_encoder(target: WhisperModel, draft: WhisperModel) -> bool:
    if not (target.has_encoder and draft.has_encoder):
        return False
    ours = target.checkpoint.with_prefix("model.encoder.")
    theirs = draft.checkpoint.with_prefix("model.encoder.")
    return ours.keys() == theirs.keys() and all(
        ours[name].shape == theirs[name].shape
        and torch.equal(ours[name], theirs[name].to(ours[name]))
        for name in ours
    )
