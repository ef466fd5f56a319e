"""Scoring a batch of posts with the text model: tokenize once, one Triton request, probabilities back.

Plain class, no Kafka: the batching agent hands it texts and gets probabilities.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np

from modpipe import log
from modpipe.textmodel.artifacts import ModelBuild
from modpipe.textmodel.tokenize import BatchTokenizer
from streams import metrics

_log = log.get(__name__)


class TextScorer:
    """Tokenizes on the client (padding to the batch's longest text) and asks Triton for spam probabilities.

    A failed request is retried with backoff for as long as the worker runs: the batch's offsets stay
    uncommitted meanwhile, so an outage of Triton delays decisions but never loses a post.
    """

    def __init__(self, build: ModelBuild, triton_url: str, model_name: str, timeout_s: float = 10.0,
                 max_seq_len: int | None = None, disabled: bool = False):
        self.disabled = disabled  # MODPIPE_TEXT_MODEL=off: NaN probabilities, no Triton call
        self.tokenizer = BatchTokenizer.for_build(build, max_seq_len)
        self.model_version = build.version
        self.triton_url = triton_url
        self.model_name = model_name
        self.timeout_s = timeout_s
        self._client = None

    def _get_client(self):
        # grpc.aio channels bind to the running loop: create the client inside the worker's loop.
        if self._client is None:
            from modpipe.serving.client import TextModelClient

            self._client = TextModelClient(self.triton_url, self.model_name, timeout_s=self.timeout_s)
        return self._client

    async def spam_probabilities(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.float32)
        if self.disabled:
            return np.full(len(texts), np.nan)
        ids, mask = self.tokenizer(texts)
        delay = 0.1
        while True:
            started = time.perf_counter()
            try:
                probs = await self._get_client().spam_probabilities(ids, mask)
                metrics.TRITON_LATENCY.observe(time.perf_counter() - started)
                return probs
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: retry, the posts stay uncommitted
                metrics.TRITON_ERRORS.inc()
                _log.warning("triton request failed; retrying", extra={"error": str(exc)[:300], "retry_in_s": delay,
                                                                        "batch": len(texts)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
