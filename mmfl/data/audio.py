"""Audio features shared by the loaders that read recordings (``av_mnist``, ``crema_d``).

One place for: reading a PCM wav into a mono float waveform (:func:`read_wav_mono`),
fitting it to a fixed window (:func:`fit_window`, centred crop or centred zero
padding), the HTK mel filterbank (:func:`mel_filterbank`) and the log-mel
spectrogram (:func:`log_mel`, ``torch.stft`` with a Hann window, power
spectrum, ``log(mel + 1e-6)``) with the hop chosen so that a window gives
exactly ``frames`` frames.

:func:`stat_fingerprint` keys a cache entry on many input files by their names,
sizes and modification times (one ``stat`` each), for folders of thousands of
small files where hashing every file's content would dominate a cached load.
"""

from __future__ import annotations

import hashlib
import math
import wave
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmfl.errors import DataError

LOG_EPS = 1e-6


def read_wav(path: str | Path, sample_rate: int = 0) -> tuple[np.ndarray, int]:
    """PCM wav (8/16/32-bit, any channel count) -> (mono float32 ``[n]`` in [-1, 1], its sample rate).

    Channels are averaged. If ``sample_rate`` is given and the file's rate differs,
    the waveform is resampled by linear interpolation. A missing, non-wav or
    truncated file raises :class:`DataError` ``"<path>: ..."``. ``path`` may also be a binary
    file object (``io.BytesIO``: a table's WAV bytes); messages then name its ``name`` attribute.
    """
    src = path if hasattr(path, "read") else str(path)
    path = getattr(path, "name", "WAV bytes") if hasattr(path, "read") else Path(path)
    try:
        with wave.open(src, "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            n = w.getnframes()
            raw = w.readframes(n)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (wave.Error, EOFError, OSError) as e:
        raise DataError(f"{path}: not a readable PCM wav file ({e})") from None
    if len(raw) < n * channels * width:
        raise DataError(f"{path}: truncated wav ({len(raw)} bytes of samples, header says "
                        f"{n * channels * width})")
    if width == 1:
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width in (2, 4):
        x = np.frombuffer(raw, dtype=f"<i{width}").astype(np.float32) / float(2 ** (8 * width - 1))
    else:
        raise DataError(f"{path}: unsupported sample width {8 * width} bits (8/16/32-bit PCM only)")
    x = x[: len(x) - len(x) % channels].reshape(-1, channels).mean(axis=1)
    if sample_rate and rate != sample_rate and len(x):
        m = max(int(round(len(x) * sample_rate / rate)), 1)
        x = np.interp(np.arange(m) * (rate / sample_rate), np.arange(len(x)), x).astype(np.float32)
    return x.astype(np.float32, copy=False), (sample_rate if sample_rate and len(x) else rate)


def read_wav_mono(path: str | Path, sample_rate: int = 0) -> np.ndarray:
    """:func:`read_wav` without the sample rate."""
    return read_wav(path, sample_rate)[0]


def fit_window(x: np.ndarray, length: int) -> np.ndarray:
    """``x`` ``[n]`` -> ``[length]``: the centred ``length`` samples, or ``x`` zero-padded on both sides."""
    n = len(x)
    if n >= length:
        s = (n - length) // 2
        return np.ascontiguousarray(x[s : s + length], dtype=np.float32)
    out = np.zeros(length, dtype=np.float32)
    s = (length - n) // 2
    out[s : s + n] = x
    return out


def hz_to_mel(f):
    """HTK mel scale: ``2595 * log10(1 + f / 700)``."""
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def mel_to_hz(m):
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


def mel_filterbank(n_mels: int, n_fft: int, sample_rate: int, f_min: float = 0.0,
                   f_max: float | None = None) -> Tensor:
    """Triangular HTK-mel filters, float32 ``[n_mels, n_fft // 2 + 1]`` (unnormalized, peak 1).

    Centres are ``n_mels`` points equally spaced on the mel scale strictly between
    ``f_min`` and ``f_max`` (default: Nyquist); filter ``m`` rises linearly (in Hz)
    from centre ``m-1`` to centre ``m`` and falls to centre ``m+1``, evaluated at the
    FFT bin frequencies ``k * sample_rate / n_fft`` (as torchaudio's
    ``melscale_fbanks(..., norm=None, mel_scale="htk")``).
    """
    f_max = sample_rate / 2.0 if f_max is None else f_max
    freqs = np.arange(n_fft // 2 + 1) * sample_rate / n_fft
    edges = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None] - lo) / (mid - lo)
    down = (hi - freqs[None]) / (hi - mid)
    return torch.from_numpy(np.maximum(0.0, np.minimum(up, down)).astype(np.float32))


def hop_for(length: int, frames: int) -> int:
    """The STFT hop that gives ``frames`` frames over ``length`` samples (``center=True``)."""
    return max(1, length // max(frames - 1, 1))


def log_mel(waves: Tensor, sample_rate: int, n_mels: int, frames: int, n_fft: int = 256) -> Tensor:
    """Log-mel spectrograms of equal-length waveforms: ``[B, L]`` -> float32 ``[B, n_mels, frames]``.

    ``torch.stft`` (Hann window of ``n_fft``, centred frames, hop :func:`hop_for`),
    power ``|X|^2``, :func:`mel_filterbank`, then ``log(mel + 1e-6)``. Frames
    beyond ``frames`` are dropped; frame ``t`` is centred on sample ``t * hop``,
    so the frames span the whole window.
    """
    waves = torch.as_tensor(waves, dtype=torch.float32)
    if waves.ndim == 1:
        waves = waves[None]
    length = waves.shape[-1]
    hop = hop_for(length, frames)
    spec = torch.stft(waves, n_fft=n_fft, hop_length=hop, win_length=n_fft,
                      window=torch.hann_window(n_fft), center=True, pad_mode="constant",
                      return_complex=True)
    power = spec.real.square() + spec.imag.square()  # [B, n_fft//2+1, T]
    mel = torch.matmul(mel_filterbank(n_mels, n_fft, sample_rate), power)
    if mel.shape[-1] < frames:  # only when length < frames - 1
        mel = torch.nn.functional.pad(mel, (0, frames - mel.shape[-1]))
    return torch.log(mel[..., :frames] + LOG_EPS)


def check_audio_params(n_mels: int, frames: int, n_fft: int, window: int, key_prefix: str = "data") -> None:
    """ConfigError for settings :func:`log_mel` cannot honour over ``window`` samples."""
    from mmfl.errors import ConfigError

    if n_mels < 1:
        raise ConfigError(f"{key_prefix}.n_mels: must be >= 1, got {n_mels}")
    if n_fft < 2 or n_fft & (n_fft - 1):
        raise ConfigError(f"{key_prefix}.n_fft: must be a power of two >= 2, got {n_fft}")
    if n_mels > n_fft // 2:
        raise ConfigError(f"{key_prefix}.n_mels: must be <= n_fft / 2 = {n_fft // 2}, got {n_mels}")
    if not 2 <= frames <= window:
        raise ConfigError(f"{key_prefix}.frames: must be in [2, {window}] (samples in the window), got {frames}")
    if n_fft > window:
        raise ConfigError(f"{key_prefix}.n_fft: must be <= the window of {window} samples, got {n_fft}")


def stat_fingerprint(paths: list[Path], root: Path | None = None) -> str:
    """BLAKE2b over ``name:size:mtime_ns`` of every file (names relative to ``root`` if given)."""
    h = hashlib.blake2b(digest_size=16)
    for p in paths:
        st = p.stat()
        name = str(p.relative_to(root)) if root is not None else str(p)
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def standardize_scalar(train: Tensor, *others: Tensor) -> tuple[float, float, list[Tensor]]:
    """(mean, std, [train, *others] standardized) with the scalar mean/std of ``train``."""
    mean = float(train.mean()) if train.numel() else 0.0
    std = float(train.std()) if train.numel() > 1 else 1.0
    if not math.isfinite(std) or std == 0.0:
        std = 1.0
    return mean, std, [(t - mean) / std for t in (train, *others)]
