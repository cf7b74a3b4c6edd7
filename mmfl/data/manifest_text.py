"""Text columns of a manifest -> tensors, by the column's ``text_encoder``.

* ``"minilm"``: frozen all-MiniLM-L6-v2 sentence embeddings, float32 ``[384]``
  (:func:`mmfl.data.featurize.text_features`, cached by content);
* ``"hash"`` / ``"hash:<d>"``: a hashed bag of words and bigrams, float32 ``[d]`` (512);
* ``"tokens"``: int64 ids ``[text_max_tokens]`` over a vocabulary built from the train
  split (0 = pad, 1 = unknown), with the valid length ``length/<m>``; for a trainable
  token-embedding encoder (the model reads ``meta.info["token_vocab_size"][m]``).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import torch

from mmfl.errors import ConfigError, DataError

TOKENS = "tokens"
DEFAULT_TEXT_ENCODER = "minilm"
_TOKEN = re.compile(r"\w+")


def check_text_encoder(name, key: str) -> str:
    """``name`` if it is a text encoder a manifest column can use; ConfigError naming ``key`` otherwise."""
    from mmfl.data.featurize import parse_text_encoder

    if isinstance(name, str) and name.strip() == TOKENS:
        return TOKENS
    try:
        parse_text_encoder(name, key)
    except ConfigError as e:
        raise ConfigError(f"{e}; or 'tokens' (token ids for a trainable embedding)") from None
    return name.strip()


def column_encoders(spec: str | dict, text_columns: list[str]) -> dict[str, str]:
    """The encoder of each text column: one name for all, or a table column -> name
    (columns it leaves out get :data:`DEFAULT_TEXT_ENCODER`). A key naming no text column
    is a ConfigError."""
    if isinstance(spec, str):
        return {m: spec.strip() for m in text_columns}
    for k in spec:
        if k not in text_columns:
            have = ", ".join(text_columns) or "none"
            raise ConfigError(f"data.text_encoder.{k}: not a text column of the manifest (text columns: {have})")
    return {m: str(spec.get(m, DEFAULT_TEXT_ENCODER)).strip() for m in text_columns}


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def build_vocab(texts: list[str], max_size: int = 0) -> dict[str, int]:
    """Token -> id, by frequency then alphabetically; 0 = ``<pad>``, 1 = ``<unk>``;
    ``max_size`` > 0 keeps that many ids in all (the most frequent tokens)."""
    counts = Counter(t for s in texts for t in tokenize(s))
    vocab = {"<pad>": 0, "<unk>": 1}
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if max_size and len(vocab) >= max_size:
            break
        vocab[tok] = len(vocab)
    return vocab


def encode_texts(texts: list[str], vocab: dict[str, int], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts -> (int64 ids ``[N, max_tokens]``, int64 lengths ``[N]``): cut, 0-padded,
    unknown tokens -> 1; a text without any word token becomes one ``<unk>`` (length 1)."""
    out = torch.zeros(len(texts), max_tokens, dtype=torch.int64)
    lengths = torch.ones(len(texts), dtype=torch.int64)
    for i, s in enumerate(texts):
        ids = [vocab.get(t, 1) for t in tokenize(s)[:max_tokens]] or [1]
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        lengths[i] = len(ids)
    return out, lengths


def encode_column(texts: list[str], train_idx: np.ndarray, encoder: str, max_tokens: int,
                  vocab_size: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """All rows' texts -> (features ``[N, ...]``, lengths ``[N]`` or None, info for meta.info).

    The vocabulary of ``"tokens"`` comes from the rows ``train_idx`` only.
    """
    if encoder == TOKENS:
        vocab = build_vocab([texts[i] for i in train_idx], vocab_size)
        ids, lengths = encode_texts(texts, vocab, max_tokens)
        return ids, lengths, {"vocab": vocab}
    from mmfl.data.featurize import text_features

    try:
        feats = text_features(texts, encoder)
    except DataError as e:
        raise DataError(f"{e}; or set data.text_encoder = \"hash\" (no download) or \"tokens\"") from None
    return feats, None, {}
