"""Speech: what is said in a video, as time-aligned lines, by one of two recognisers.

One small interface, :class:`Recognizer` (a name, the sample rate it reads, and
``transcribe(chunks)`` from contiguous audio chunks to ``(start, end, text)`` lines), and two
engines:

- :class:`PocketSphinxRecognizer` (``--speech pocketsphinx``): CMU PocketSphinx 5 with the US
  English acoustic model, dictionary and language model its PyPI wheel carries (nothing is
  downloaded). Its voice activity detector (``Endpointer``) cuts the stream into utterances;
  each is decoded, and its words (timed at 10 ms) are grouped into lines of at most
  :data:`LINE_S` seconds, split at pauses. Fast and small, and inaccurate: docs/text.md
  gives the word error measured here.
- :class:`WhisperRecognizer` (``--speech whisper:MODEL``): faster-whisper (Whisper on
  CTranslate2), the recommended engine. ``MODEL`` is a model name (``small``, ``base.en``,
  ``large-v3``...), fetched from the Hugging Face hub on first use and cached as open_clip
  caches CLIP's weights, or the path of a local CTranslate2 model folder. Audio is given to
  it :data:`WHISPER_WINDOW_S` seconds at a time (a word cut by a window's edge may be lost).

A model is loaded on first use; one that cannot be loaded is one sentence
(:class:`SpeechModelError`) and the recogniser keeps failing fast with it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from .audio import AudioChunk, NoAudioError, audio_chunks
from .lines import SourceReport, SourceUnavailable, TextLine

__all__ = ["LINE_S", "WHISPER_WINDOW_S", "PocketSphinxRecognizer", "Recognizer",
           "SpeechModelError", "WhisperRecognizer", "make_recognizer", "merge_spans",
           "speech_lines"]

LINE_S = 8.0  # the longest line PocketSphinx's words are grouped into
_PAUSE_S = 0.6  # a pause this long between words starts a new line
_UTTERANCE_S = 30.0  # speech without a pause is decoded this many seconds at a time
WHISPER_WINDOW_S = 300.0  # 5 min of float32 at 16 kHz: 19 MB at once
_FILLER = re.compile(r"^[<\[].*[>\]]$")  # <s>, </s>, <sil>, [NOISE] ...
_ALTERNATE = re.compile(r"\(\d+\)$")  # "the(2)": the dictionary's second pronunciation


class SpeechModelError(SourceUnavailable):
    """A recogniser whose model cannot be loaded (one sentence)."""


class Recognizer(Protocol):
    """A speech recogniser (see the module docstring)."""

    name: str  # what is recorded per transcribed row: "pocketsphinx", "whisper:small"
    rate: int  # the sample rate it reads

    def transcribe(self, chunks: Iterable[AudioChunk]) -> Iterator[tuple[float, float, str]]:
        """``(start s, end s, text)`` per line said in contiguous ``chunks`` (times are the
        chunks' own)."""


def make_recognizer(spec: str) -> Recognizer:
    """``"pocketsphinx"`` or ``"whisper:MODEL"`` (a name or a local folder); not loaded yet."""
    if spec == "pocketsphinx":
        return PocketSphinxRecognizer()
    kind, _, model = spec.partition(":")
    if kind == "whisper" and model:
        return WhisperRecognizer(model)
    raise ValueError(f"unknown speech engine {spec!r}: use pocketsphinx or whisper:MODEL "
                     "(a model name such as small, or a local model folder)")


class _Lazy:
    """Loads once on first use; a failure is kept and raised again at once."""

    _model = None
    _error: SpeechModelError | None = None

    def model(self):
        if self._error is not None:
            raise self._error
        if self._model is None:
            try:
                self._model = self._load()
            except SpeechModelError as exc:
                self._error = exc
                raise
        return self._model

    def _load(self):
        raise NotImplementedError


class PocketSphinxRecognizer(_Lazy):
    """PocketSphinx with the English model of its wheel (module docstring)."""

    name = "pocketsphinx"
    rate = 16000

    def _load(self):
        try:
            import pocketsphinx
        except ImportError:
            raise SpeechModelError("PocketSphinx is not installed (pip install "
                                   "'dicosa[text]')") from None
        try:
            return pocketsphinx.Decoder(samprate=self.rate, loglevel="FATAL")
        except (RuntimeError, ValueError) as exc:
            raise SpeechModelError(f"PocketSphinx could not load its English model ({exc})"
                                   ) from None

    def transcribe(self, chunks: Iterable[AudioChunk]) -> Iterator[tuple[float, float, str]]:
        from pocketsphinx import Endpointer

        decoder = self.model()
        endpointer = Endpointer(sample_rate=self.rate)
        width = endpointer.frame_bytes
        origin, pending, speech = None, b"", []
        for t0, samples in chunks:
            origin = t0 if origin is None else origin
            pending += samples.astype("<i2").tobytes()
            usable = len(pending) - len(pending) % width
            for at in range(0, usable, width):
                said = endpointer.process(pending[at:at + width])
                if said is not None:
                    speech.append(said)
                if speech and (not endpointer.in_speech
                               or len(speech) * endpointer.frame_length >= _UTTERANCE_S):
                    yield from self._decode(decoder, speech, origin + endpointer.speech_start)
                    speech = []
            pending = pending[usable:]
        if endpointer.in_speech or speech:
            said = endpointer.end_stream(pending)
            if said is not None:
                speech.append(said)
        if speech:
            yield from self._decode(decoder, speech, (origin or 0.0) + endpointer.speech_start)

    @staticmethod
    def _decode(decoder, speech: list[bytes], start: float) -> Iterator[tuple[float, float,
                                                                            str]]:
        """Decode one utterance (whole: the acoustic normalisation sees all of it) that began
        at ``start`` s; its words grouped into lines."""
        decoder.start_utt()
        decoder.process_raw(b"".join(speech), full_utt=True)
        decoder.end_utt()
        words = [(_ALTERNATE.sub("", s.word), start + s.start_frame / 100.0,
                  start + (s.end_frame + 1) / 100.0) for s in decoder.seg()
                 if not _FILLER.match(s.word)]
        yield from group_words(words)


def group_words(words: list[tuple[str, float, float]]) -> Iterator[tuple[float, float, str]]:
    """Timed words as lines: a new line after a pause of :data:`_PAUSE_S` or when the line
    would pass :data:`LINE_S` seconds."""
    line: list[tuple[str, float, float]] = []
    for word in words:
        if line and (word[1] - line[-1][2] > _PAUSE_S or word[2] - line[0][1] > LINE_S):
            yield line[0][1], line[-1][2], " ".join(w for w, _, _ in line)
            line = []
        line.append(word)
    if line:
        yield line[0][1], line[-1][2], " ".join(w for w, _, _ in line)


class WhisperRecognizer(_Lazy):
    """faster-whisper (module docstring): ``model`` a name or a local model folder."""

    rate = 16000

    def __init__(self, model: str, device: str = "auto", compute_type: str = "default"):
        self.model_name, self.device, self.compute_type = model, device, compute_type
        self.name = f"whisper:{model}"

    def _load(self):
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise SpeechModelError("faster-whisper is not installed (pip install "
                                   "'dicosa[text]')") from None
        local = Path(self.model_name).expanduser()
        try:
            return WhisperModel(str(local) if local.is_dir() else self.model_name,
                                device=self.device, compute_type=self.compute_type)
        except Exception as exc:  # the hub's, CTranslate2's and the OS's errors alike
            reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else (
                type(exc).__name__)
            raise SpeechModelError(
                f"the whisper model {self.model_name!r} could not be loaded ({reason}); give "
                "the name of a model that can be fetched, or the folder of a local "
                "CTranslate2 model (whisper:/path/to/model)") from None

    def transcribe(self, chunks: Iterable[AudioChunk]) -> Iterator[tuple[float, float, str]]:
        model = self.model()
        for t0, audio in _windows(chunks, int(WHISPER_WINDOW_S * self.rate)):
            segments, _ = model.transcribe(audio.astype(np.float32) / 32768.0)
            for segment in segments:
                text = segment.text.strip()
                if text:
                    yield t0 + segment.start, t0 + segment.end, text


def _windows(chunks: Iterable[AudioChunk], size: int) -> Iterator[AudioChunk]:
    """Contiguous chunks regrouped ``size`` samples at a time (the last one shorter)."""
    buffer, held, first = [], 0, None
    for t0, samples in chunks:
        first = t0 if first is None else first
        buffer.append(samples)
        held += len(samples)
        if held >= size:
            yield first, np.concatenate(buffer)
            first, buffer, held = None, [], 0  # the next chunk says where it starts
    if held:
        yield first, np.concatenate(buffer)


def merge_spans(start: np.ndarray, end: np.ndarray) -> list[tuple[float, float]]:
    """The union of time ranges, as sorted disjoint ``(start, end)`` ranges."""
    merged: list[list[float]] = []
    for s, e in sorted(zip(start.tolist(), end.tolist(), strict=True)):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def speech_lines(video: str | Path, spans: list[tuple[float, float]], recognizer: Recognizer
                 ) -> tuple[list[TextLine], SourceReport]:
    """What ``recognizer`` hears in ``spans`` of ``video``.

    A video without (decodable) sound is a counted skip with its sentence; silence gives no
    line. Raises :class:`SpeechModelError` when the recogniser cannot load its model.
    """
    report = SourceReport("speech", recognizer.name, videos=1)
    began = time.perf_counter()
    lines: list[TextLine] = []
    try:
        for start, end in spans:
            for t0, t1, text in recognizer.transcribe(
                    _counted(audio_chunks(video, recognizer.rate, start, end), report,
                             recognizer.rate)):
                lines.append(TextLine(str(video), t0, t1, text, "speech"))
    except NoAudioError as exc:
        report.skipped["videos without sound"] += 1
        report.note(str(exc))
    report.found, report.lines = int(bool(lines)), len(lines)
    report.work_s = time.perf_counter() - began
    return lines, report


def _counted(chunks: Iterable[AudioChunk], report: SourceReport, rate: int
             ) -> Iterator[AudioChunk]:
    for chunk in chunks:
        report.seconds += len(chunk[1]) / rate
        yield chunk
