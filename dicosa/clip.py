"""open_clip loading, the tiny test architecture, and CLIP's text forward at N_t < 77 tokens."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import open_clip
import torch
from open_clip.model import CLIP

from .errors import PretrainedWeightsError

log = logging.getLogger(__name__)

TINY_ARCH = "dicosa-tiny"
_CONFIG_DIR = Path(__file__).parent / "model_configs"

# CLIP's preprocessing constants, applied on the device to uint8 frames.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def register_architectures() -> None:
    """Make dicosa's architectures (the tiny test model) known to open_clip's registry."""
    if TINY_ARCH not in open_clip.list_models():
        open_clip.add_model_config(_CONFIG_DIR)


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except RuntimeError as e:
            if "TorchScript" in str(e) or "constants.pkl" in str(e):
                raise ValueError(
                    f"{path} is a TorchScript archive (OpenAI's original .pt); use "
                    "pretrained='openai' or an open_clip state dict instead"
                ) from e
            raise
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict (found {type(state).__name__})")
    # Checkpoints written under DDP prefix every key with "module.".
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_clip(
    arch: str = "ViT-B-32",
    pretrained: str | Path | None = "openai",
    *,
    cache_dir: str | None = None,
    quick_gelu: bool | None = None,
    device: str | None = None,
) -> CLIP:
    """Build an open_clip CLIP model and load its weights.

    Args:
        arch: any open_clip architecture with a CLIP text tower (``open_clip.list_models()``),
            or ``"dicosa-tiny"`` (width 64, 2 layers, 32 px, patch 8) for tests.
        pretrained: an open_clip pretrained tag (``"openai"``), a path to a state dict
            (``.pt``/``.bin``/``.pth``/``.safetensors``, plain or under ``"state_dict"``),
            or ``None`` for random weights.

    OpenAI's weights were trained with QuickGELU; open_clip's plain ``ViT-B-32`` config uses
    nn.GELU, so QuickGELU is forced whenever ``pretrained == "openai"``. ``quick_gelu``
    overrides that rule: rebuilding a model fine-tuned from OpenAI's weights without them
    (``pretrained=None``) must keep QuickGELU. ``device="meta"`` (with ``pretrained=None``)
    builds the architecture without allocating or initialising any weight, for weights
    that are assigned afterwards (:func:`dicosa.checkpoint.load` of one tower).
    """
    register_architectures()
    if arch not in open_clip.list_models():
        import difflib

        close = difflib.get_close_matches(arch, open_clip.list_models(), n=3)
        raise ValueError(f"unknown CLIP architecture '{arch}'; close matches: {close}")

    path = Path(pretrained) if pretrained is not None else None
    is_file = path is not None and (
        path.suffix in (".pt", ".pth", ".bin", ".safetensors") or "/" in str(pretrained)
        or path.is_file()
    )
    if is_file:
        model = _from_state_dict_file(
            arch, path, _wants_quick_gelu(arch) if quick_gelu is None else quick_gelu)
    elif pretrained is None:
        # Random weights were asked for: open_clip's "No pretrained weights loaded ... Model
        # initialized randomly" says nothing the caller does not know (the demo says it once).
        with _quiet_random_init():
            model = open_clip.create_model(
                arch, pretrained=None, device=device or "cpu",
                force_quick_gelu=_wants_quick_gelu(arch) if quick_gelu is None else quick_gelu)
        log.debug("CLIP '%s' built with random weights (pretrained: None)", arch)
    else:
        quick = pretrained == "openai" or _wants_quick_gelu(arch)
        quick = quick if quick_gelu is None else quick_gelu
        try:
            # require_pretrained: weights that fail to load are an error, never a silent
            # random model.
            model = open_clip.create_model(
                arch, pretrained=pretrained, force_quick_gelu=quick, cache_dir=cache_dir,
                require_pretrained=True,
            )
        except RuntimeError as e:
            raise PretrainedWeightsError(
                f"cannot load CLIP weights '{pretrained}' for {arch} ({e}). Offline? Set "
                "model.pretrained to a local state-dict file, or to null for random weights."
            ) from e
    if not isinstance(model, CLIP):
        raise ValueError(
            f"architecture '{arch}' builds {type(model).__name__}; dicosa needs open_clip's CLIP "
            "class (a CLIP text transformer to initialise the temporal transformer from)"
        )
    return model


class _DropRandomInitWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No pretrained weights loaded for model")


@contextlib.contextmanager
def _quiet_random_init() -> Iterator[None]:
    """Drop open_clip's random-initialisation warning (logged on the root logger) while
    building a model whose random weights were requested; every other message passes."""
    root = logging.getLogger()
    quiet = _DropRandomInitWarning()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def _from_state_dict_file(arch: str, path: Path, quick_gelu: bool):
    """``arch`` with the weights of the state-dict file ``path``: one sentence where the
    file is missing or its keys or shapes are not the architecture's."""
    if not path.is_file():
        raise FileNotFoundError(f"CLIP checkpoint not found: {path}")
    model = open_clip.create_model(arch, pretrained=None, force_quick_gelu=quick_gelu)
    state = _load_state_dict(path)
    missing, unexpected = _diff_keys(model, state)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match architecture '{arch}': "
            f"{len(missing)} missing keys (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected keys (e.g. {unexpected[:3]})"
        )
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"checkpoint {path} does not match architecture '{arch}': {e}") from e
    return model


def _wants_quick_gelu(arch: str) -> bool:
    return arch.endswith("-quickgelu")


def _diff_keys(model: torch.nn.Module, state: dict) -> tuple[list[str], list[str]]:
    expected = set(model.state_dict())
    given = set(state)
    return sorted(expected - given), sorted(given - expected)


def clip_dims(clip: CLIP) -> dict[str, int]:
    """Embedding width, text width/heads/layers and image size of an open_clip CLIP model."""
    image_size = clip.visual.image_size
    if isinstance(image_size, (tuple, list)):
        image_size = image_size[0]
    return {
        "embed_dim": clip.text_projection.shape[1],
        "text_width": clip.transformer.width,
        "text_heads": clip.transformer.resblocks[0].attn.num_heads,
        "text_layers": len(clip.transformer.resblocks),
        "context_length": clip.positional_embedding.shape[0],
        "image_size": int(image_size),
    }


def encode_text_tokens(clip: CLIP, tokens: torch.Tensor) -> torch.Tensor:
    """CLIP's text tower on ``tokens [B, L]`` with L <= 77, returning the EOT vector ``[B, D]``.

    open_clip's ``encode_text`` adds all 77 positional rows; DiCoSA uses the first L rows
    (not an interpolation), so the forward is rewritten here with the sliced embedding and
    causal mask. Under the causal mask the EOT state reads only positions up to the EOT, so the
    columns after the batch's last EOT are padding that cannot change it: on the CPU they are
    dropped, which makes a short query (~7 of 32 tokens) about 3x cheaper to encode. On an
    accelerator the length would cost a host sync and vary the shapes a compiled tower sees
    (neither measured here), so the full length is kept there.
    """
    if tokens.device.type == "cpu" and tokens.ndim == 2 and tokens.shape[1] > 1:
        tokens = tokens[:, :int(tokens.argmax(dim=-1).max()) + 1]
    x, eot_at = _text_tower(clip, tokens)
    return _project_text(clip, x[torch.arange(x.shape[0], device=x.device), eot_at])


def encode_text_token_states(clip: CLIP, tokens: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One text-tower forward giving the EOT vector ``[B, D]`` (what
    :func:`encode_text_tokens` returns) and every token's state through the same final
    LayerNorm and projection ``[B, L, D]``, with ``[B, L]`` bool marking the tokens up to and
    including EOT (what VDR's text side max-pools over)."""
    x, eot_at = _text_tower(clip, tokens)
    eot = _project_text(clip, x[torch.arange(x.shape[0], device=x.device), eot_at])  # [B, D]
    valid = torch.arange(x.shape[1], device=x.device)[None, :] <= eot_at[:, None]  # [B, L]
    return eot, _project_text(clip, x), valid


def _text_tower(clip: CLIP, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token states after ``ln_final`` ``[B, L, W]`` and the EOT position ``[B]``."""
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, L], got shape {tuple(tokens.shape)}")
    length = tokens.shape[1]
    if length > clip.positional_embedding.shape[0]:
        raise ValueError(
            f"{length} tokens exceed CLIP's context length {clip.positional_embedding.shape[0]}"
        )
    cast_dtype = clip.transformer.get_cast_dtype()
    x = clip.token_embedding(tokens).to(cast_dtype)  # [B, L, W]
    x = x + clip.positional_embedding[:length].to(cast_dtype)
    x = clip.transformer(x, attn_mask=clip.attn_mask[:length, :length])
    # The EOT token has the largest id in CLIP's vocabulary, so argmax finds it.
    return clip.ln_final(x), tokens.argmax(dim=-1)


def _project_text(clip: CLIP, x: torch.Tensor) -> torch.Tensor:
    if isinstance(clip.text_projection, torch.nn.Linear):
        return clip.text_projection(x)
    return x @ clip.text_projection


def get_tokenizer(arch: str, context_length: int) -> Callable[[list[str]], torch.Tensor]:
    """A picklable callable mapping a list of captions to ``LongTensor [B, context_length]``.

    Long captions are truncated with the EOT token kept as the last token.
    """
    register_architectures()
    tokenizer = open_clip.get_tokenizer(arch)
    return functools.partial(tokenizer, context_length=context_length)
