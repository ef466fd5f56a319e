"""Scoring a batch of posts with the text model: the probability the build serves (the transformer's through
the build's lexical stack, modpipe/textmodel/lexical.py) for each text, one Triton request a batch.

Plain classes, no Kafka: the decision batcher hands `TextScorer` texts and gets probabilities.

Two text paths (MODPIPE_TEXT_PATH). `triton`, the default: the worker sends the raw texts to
spam_text_ensemble, where Triton's tokenizer, the transformer and the lexical stack run on instances of
their own (triton_models/README.md); the worker's CPU per text is a cache key and the request. `worker`: the
worker tokenizes, asks spam_text for the transformer's probability and applies the stack itself (numpy:
modpipe/serving/charhead.py), ~0.4 ms of worker CPU per text (docs/benchmarks.md).

Campaigns post the same text many times. `TextCache` remembers, per model version, the served probability of
each text (path `triton`: keyed by the text without surrounding whitespace, lower-cased where that cannot change
what the tokenizer reads, `cache_text`) or the transformer's probability of each exact model input (path
`worker`: the token ids after normalisation and truncation; the stack then runs on every text), so a repeat
skips Triton. Bounded (LRU) by entries and by bytes (its share of MODPIPE_WORKER_MEMORY_MB); hits and misses are
metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence

import numpy as np
from modpipe.streams import metrics

from modpipe import log, memory
from modpipe.serving.charhead import CharHead
from modpipe.textmodel.artifacts import ModelBuild
from modpipe.textmodel.tokenize import BatchTokenizer

_log = log.get(__name__)


DEFAULT_CACHE_TEXTS = 100_000
OUTAGE_POLICIES = ("decide", "review", "wait")
TEXT_PATHS = ("triton", "worker")
# Python's str.lower() gives a final capital sigma the final form; the tokenizer lower-cases character by
# character: the only case mapping where the two differ.
_CONTEXT_CASED = "\u03a3"


def cache_text(text: str, raw_matched: Sequence[str] = ()) -> str:
    """The form of a text the served-probability cache is keyed by: one the build's tokenizer and the lexical
    stack read exactly as they read `text`. Surrounding whitespace is dropped (the tokenizer splits on it, the
    stack's words too) and the text is lower-cased (the normaliser lower-cases after folding, with classes that
    ignore case), except where lower-casing could change the tokens: a final sigma, or an added token the
    tokenizer matches in the raw text ("[SEP]" typed in a post), which lower case would no longer match."""
    text = text.strip()
    low = text.lower()
    if _CONTEXT_CASED in text or any(token.lower() in low for token in raw_matched):
        return text
    return low


class TextModelUnavailable(RuntimeError):
    """Triton has failed every request for longer than the outage limit (MODPIPE_TEXT_MODEL_OUTAGE_S)."""


class TextCache:
    """Spam probability per exact model input (token ids) and model version; least recently used evicted."""

    def __init__(self, model_version: str, capacity: int = DEFAULT_CACHE_TEXTS, max_bytes: int | None = None):
        self.model_version = model_version
        self.capacity = capacity
        if max_bytes is None:
            max_bytes = memory.budget_bytes("text", memory.DEFAULT_WORKER_MEMORY_MB)
        self._items = memory.register(memory.ByteLRU("text", max_bytes, max_entries=max(capacity, 0)))

    @property
    def hits(self) -> int:
        return self._items.hits

    @property
    def misses(self) -> int:
        return self._items.misses

    def key(self, ids: np.ndarray) -> bytes:
        """Key of one row of token ids without its padding."""
        return hashlib.blake2b(ids.tobytes(), digest_size=16, key=self.model_version.encode()[:64]).digest()

    def text_key(self, text: str) -> bytes:
        """Key of a text's served probability (`cache_text` form); never equal to a `key` of token ids."""
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16, person=b"text",
                               key=self.model_version.encode()[:64]).digest()

    def get(self, key: bytes) -> float | None:
        return self._items.get(key)

    def put(self, key: bytes, probability: float) -> None:
        self._items.put(key, probability)

    @property
    def bytes(self) -> int:
        return self._items.bytes

    def __len__(self) -> int:
        return len(self._items)


class TextScorer:
    """Asks Triton for the served spam probabilities of texts: raw texts to the ensemble (`text_path`
    "triton"), or tokenized here (padding to the batch's longest text) to the model with the stack applied
    here ("worker").

    A failed request is retried with backoff; the batch's offsets stay uncommitted meanwhile, so an outage of
    Triton delays decisions but never loses a post. Once requests have failed for `outage_s` in a row the
    scorer raises `TextModelUnavailable` instead (policy `decide` or `review`: the batcher then decides
    without the text model) and keeps raising at once until a request succeeds; `wait=True`
    and policy `wait` retry for as long as it takes.
    """

    def __init__(self, build: ModelBuild, triton_url: str, model_name: str, timeout_s: float = 10.0,
                 max_seq_len: int | None = None, disabled: bool = False, cache_texts: int = DEFAULT_CACHE_TEXTS,
                 outage_s: float = 30.0, outage_policy: str = "decide", text_path: str = "triton"):
        if outage_policy not in OUTAGE_POLICIES:
            raise ValueError(f"outage policy {outage_policy!r}: expected one of {OUTAGE_POLICIES}")
        if text_path not in TEXT_PATHS:
            raise ValueError(f"text path {text_path!r}: expected one of {TEXT_PATHS}")
        self.outage_s, self.outage_policy = outage_s, outage_policy
        self._failing_since: float | None = None  # monotonic time of the first failure of the current run
        self.disabled = disabled  # MODPIPE_TEXT_MODEL=off: NaN probabilities, no Triton call
        # The build's window is what Triton's own tokenizer uses: a shorter MODPIPE_MAX_SEQ_LEN may cut texts
        # further, a longer one would feed positions the model never learnt.
        self.tokenizer = BatchTokenizer.for_build(build, min(max_seq_len or build.max_seq_len, build.max_seq_len))
        if text_path == "triton" and self.tokenizer.max_len < build.max_seq_len:
            # Triton's tokenizer reads the build's whole window: a shorter one is cut here
            _log.warning("MODPIPE_MAX_SEQ_LEN is shorter than the build's window: the worker tokenizes",
                         extra={"max_seq_len": self.tokenizer.max_len, "build_max_seq_len": build.max_seq_len})
            text_path = "worker"
        self.text_path = text_path
        self.model_version = build.version
        # lexical.StackedScorer, or None (the transformer alone); the ensemble applies its own copy
        self.stack = None if disabled or text_path == "triton" else build.stack()
        self._margins = None
        if self.stack is not None:
            fast = CharHead.of(self.stack.head)  # a character head in numpy, ~5x faster, same margins
            self._margins = fast.margins if fast is not None else self.stack.head.margins
        self.cache = TextCache(build.version, cache_texts)  # its bytes: the worker's budget (Wiring)
        self.triton_url = triton_url
        self.model_name = model_name
        self.timeout_s = timeout_s
        self._client = None
        self.answered = disabled  # a Triton request has succeeded (the path is warm); always true when off

    def _get_client(self):
        # grpc.aio channels bind to the running loop: create the client inside the worker's loop.
        if self._client is None:
            from modpipe.serving.client import TextModelClient

            self._client = TextModelClient(self.triton_url, self.model_name, timeout_s=self.timeout_s)
        return self._client

    @property
    def in_outage(self) -> bool:
        """Requests have failed for longer than the outage limit (and none succeeded since)."""
        return self._failing_since is not None and time.monotonic() - self._failing_since >= self.outage_s

    async def spam_probabilities(self, texts: Sequence[str], wait: bool = False) -> np.ndarray:
        """One served probability per text: the transformer's (repeats from the cache, the rest in one Triton
        request) through the build's lexical stack when it has one. Raises `TextModelUnavailable` during an
        outage unless `wait` (or the policy is `wait`)."""
        if not texts:
            return np.zeros(0, dtype=np.float64)
        if self.disabled:
            return np.full(len(texts), np.nan)
        if self.text_path == "triton":
            return await self._served_probabilities(texts, wait)
        if self.stack is None:
            ids, mask = self.tokenizer(texts)
            return await self._model_probabilities(ids, mask, wait)
        # The stack's word model reads the text as the tokenizer normalises it: normalised once, read twice.
        ids, mask, normalized = self.tokenizer.encode_normalized(texts)
        proba = await self._model_probabilities(ids, mask, wait)
        # The word model reads the whole text (the cache key only the transformer's window), so it runs for
        # every text, repeats included (`modpipe bench model` times it: docs/benchmarks.md).
        margins = self._margins(normalized)
        served = 1.0 / (1.0 + np.exp(-self.stack.decision(proba, margins)))
        return np.where(np.isnan(proba), np.nan, served)  # as StackedScorer.spam_proba

    async def _served_probabilities(self, texts: Sequence[str], wait: bool) -> np.ndarray:
        """Path `triton`: the ensemble's served probability per text, repeats (in `cache_text` form) from the
        cache."""
        client = self._get_client

        def score(rows: list[int]):
            part = [texts[i] for i in rows]
            return self._score(lambda: client().spam_probabilities_text(part), len(part), wait)

        if self.cache.capacity <= 0:
            return await score(list(range(len(texts))))
        raw_matched = self.tokenizer._raw_matched  # noqa: SLF001 - tokenize.py is part of the build's key
        return await self._cached([self.cache.text_key(cache_text(t, raw_matched)) for t in texts], score)

    async def _model_probabilities(self, ids: np.ndarray, mask: np.ndarray, wait: bool) -> np.ndarray:
        client = self._get_client
        if self.cache.capacity <= 0:  # off: every text computed, repeats included
            return await self._score(lambda: client().spam_probabilities(ids, mask), len(ids), wait)
        lengths = mask.sum(axis=1)

        def score(rows: list[int]):
            width = int(lengths[rows].max())
            part_ids, part_mask = ids[rows, :width], mask[rows, :width]
            return self._score(lambda: client().spam_probabilities(part_ids, part_mask), len(rows), wait)

        return await self._cached([self.cache.key(ids[i, :lengths[i]]) for i in range(len(ids))], score)

    async def _cached(self, keys: list[bytes], score) -> np.ndarray:
        """A value per key: hits from the cache, each distinct miss once through `score(rows)` (awaitable of
        one value per row), stored after."""
        out = np.empty(len(keys), dtype=np.float64)
        misses: dict[bytes, list[int]] = {}  # the same input twice in one batch is scored once
        for i, key in enumerate(keys):
            if key in misses:
                misses[key].append(i)
                continue
            hit = self.cache.get(key)
            if hit is None:
                misses[key] = [i]
            else:
                out[i] = hit
        scored = [rows[0] for rows in misses.values()]
        metrics.TEXT_CACHE.labels("hit").inc(len(keys) - len(scored))
        metrics.TEXT_CACHE.labels("miss").inc(len(scored))
        if scored:
            probs = await score(scored)
            for (key, rows), p in zip(misses.items(), probs, strict=True):
                out[rows] = p
                self.cache.put(key, float(p))
        metrics.TEXT_CACHE_ENTRIES.set(len(self.cache))
        return out

    async def _score(self, request, n: int, wait: bool = False) -> np.ndarray:
        """`await request()` (one Triton request for n texts) until it answers, within the outage rules."""
        delay = 0.1
        degrade = not wait and self.outage_policy != "wait"
        while True:
            started = time.perf_counter()
            try:
                probs = await request()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: retry, the posts stay uncommitted
                metrics.TRITON_ERRORS.inc()
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                if self.in_outage:
                    metrics.TEXT_MODEL_AVAILABLE.set(0)
                    if degrade:
                        raise TextModelUnavailable(f"Triton has failed for {self.outage_s:.0f} s: {exc}") from exc
                _log.warning("triton request failed; retrying", extra={"error": str(exc)[:300], "retry_in_s": delay,
                                                                        "batch": n})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            metrics.TRITON_LATENCY.observe(time.perf_counter() - started)
            if self._failing_since is not None:
                _log.info("triton answers again", extra={"failing_for_s": round(time.monotonic() - self._failing_since, 1)})
                self._failing_since = None
            metrics.TEXT_MODEL_AVAILABLE.set(1)
            self.answered = True
            return probs

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
