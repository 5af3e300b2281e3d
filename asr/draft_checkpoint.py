"""The distilled-draft file format: a decoder-only Whisper that borrows its target's embeddings.

A draft directory is a transformers WhisperForCausalLM checkpoint minus the tensors it shares
with its target (token and position embeddings, the output head tied to them, and each layer's
cross-attention key/value projections, which are the target's kept layers' own), plus the
tokenizer files and, under config.json's `specscribe_draft` key, the target it was made for,
which target layers it kept, and the token ids its reduced output head scores. Loading it
needs the loaded target.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from asr.whisper_checkpoint import Checkpoint, Tensors, config_namespace, file_reader

DRAFT_KEY = "specscribe_draft"
SHARED_TENSORS = (
    "model.decoder.embed_tokens.weight",
    "model.decoder.embed_positions.weight",
    "proj_out.weight",
)
# Name parts of the tensors a draft never trains: the shared ones above, and the cross-attention
# key/value projections (the target's, so the draft reads the target's projected encoder output).
FROZEN_PARTS = (
    "embed_tokens",
    "embed_positions",
    "proj_out",
    "encoder_attn.k_proj",
    "encoder_attn.v_proj",
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "preprocessor_config.json",
)


def share_target_tensors(draft, target_decoder) -> None:
    """Points the draft's SHARED_TENSORS at the target decoder's own (no copies): token and
    position embeddings, and the output head tied to the token embeddings."""
    decoder = draft.model.decoder
    decoder.embed_tokens.weight = target_decoder.embed_tokens.weight
    decoder.embed_positions.weight = target_decoder.embed_positions.weight
    draft.proj_out.weight = target_decoder.embed_tokens.weight


def is_distilled_draft(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    return config.is_file() and DRAFT_KEY in json.loads(config.read_text())


def check_replaceable(out_dir: Path) -> None:
    """Raises ValueError where writing a draft to out_dir would remove something else: a draft
    replaces the folder it is written to, which may be missing, empty or a draft (its
    config.json says so), never a folder of other files."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ValueError(f"{out_dir} is a file: a draft is written as a folder")
    if any(out_dir.iterdir()) and not is_distilled_draft(out_dir):
        raise ValueError(
            f"{out_dir} holds other files, and a draft replaces the folder it is written to: "
            "name a new folder (or an earlier draft's)"
        )


def save_draft(
    draft,
    vocabulary: torch.Tensor,
    layers: tuple[int, ...],
    target_dir: Path,
    out_dir: Path,
    recipe: dict,
) -> None:
    """Writes the draft's own tensors (float16), config, tokenizer files and recipe.json to
    out_dir, atomically (a temporary sibling directory renamed into place). Raises ValueError
    where out_dir holds something other than a draft (`check_replaceable`)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        state = {
            name: tensor.detach().to(torch.float16).contiguous()
            for name, tensor in draft.state_dict().items()
            if not any(part in name for part in FROZEN_PARTS)
        }
        save_file(state, staging / "model.safetensors", metadata={"format": "pt"})
        config = draft.config.to_dict()
        config["dtype"] = "float16"
        config[DRAFT_KEY] = {
            "target": recipe.get("target"),
            "cross_from_target_layers": list(layers),
            # None: the whole vocabulary (no id list to store)
            "output_vocabulary": (
                None if len(vocabulary) == draft.config.vocab_size else vocabulary.tolist()
            ),
        }
        (staging / "config.json").write_text(json.dumps(config, indent=1))
        for name in TOKENIZER_FILES:
            if (Path(target_dir) / name).exists():
                shutil.copy2(Path(target_dir) / name, staging / name)
        (staging / "recipe.json").write_text(json.dumps(recipe, indent=1))
        # mkdtemp made the directory private; a draft is as readable as any installed file.
        staging.chmod(0o755)
        for file in staging.iterdir():
            file.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def read_draft(
    path: str | Path, target: Checkpoint
) -> tuple[Checkpoint, torch.Tensor | None, tuple]:
    """A distilled draft's checkpoint, completed with its target's shared tensors (the same
    tensors, not copies): the token and position embeddings, the output head, and the
    cross-attention key/value projections of the target layers its layers were made from.

    target: the target's checkpoint, whose device and dtype the draft takes.
    Returns (checkpoint, vocabulary: Tensor, shape = (head size,), or None for the whole
    vocabulary, layers: the target layer each draft layer reads the cross-attention of).
    Raises ValueError when the draft does not fit this target.
    """
    from safetensors.torch import load_file

    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    meta = raw.pop(DRAFT_KEY)
    config = config_namespace(raw)
    for field in ("d_model", "vocab_size", "max_target_positions", "num_mel_bins"):
        ours, theirs = getattr(config, field), getattr(target.config, field)
        if ours != theirs:
            raise ValueError(
                f"draft {path} was made for {meta.get('target')}: its {field} is {ours}, "
                f"the target's is {theirs}"
            )
    layers = tuple(meta["cross_from_target_layers"])
    target_layers = target.config.decoder_layers
    if len(layers) != config.decoder_layers or max(layers) >= target_layers:
        raise ValueError(
            f"draft {path}: its layers come from target layers {list(layers)}, which do not fit "
            f"a {target_layers}-layer target"
        )
    like = target.tensors["model.decoder.embed_tokens.weight"]

    def convert(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device=like.device, dtype=like.dtype)

    own_file = path / "model.safetensors"
    own = {name: convert(name, tensor) for name, tensor in load_file(str(own_file)).items()}
    tensors = Tensors(own, file_reader(own_file, convert))  # only its own are released
    for name in SHARED_TENSORS:
        tensors[name] = target.output_weight if name == "proj_out.weight" else target.tensors[name]
    for new, old in enumerate(layers):
        for kind in ("k_proj.weight", "v_proj.weight", "v_proj.bias"):
            source = f"model.decoder.layers.{old}.encoder_attn.{kind}"
            tensors[f"model.decoder.layers.{new}.encoder_attn.{kind}"] = target.tensors[source]
    expected = {k for k in target.names() if k.startswith("model.decoder.layers.0.")}
    found = {k for k in tensors if k.startswith("model.decoder.layers.0.")}
    if not expected <= found:
        raise ValueError(f"draft {path}: missing {sorted(expected - found)}")
    generation_file = path / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    vocabulary = meta.get("output_vocabulary")
    if vocabulary is not None and len(vocabulary) < config.vocab_size:
        vocabulary = torch.tensor(vocabulary, dtype=torch.long, device=like.device)
    else:
        vocabulary = None
    return Checkpoint(path, config, generation, tensors), vocabulary, layers
