"""Clients of the served text model.

`TextModelClient` (asyncio, `tritonclient.grpc.aio`) is what the stream workers use: one per event
loop, many requests in flight on one HTTP/2 channel. `SyncTextModelClient` wraps it with a private
event loop for the CLI and tests. (tritonclient.http's async_infer serialises submissions and its
clients are not thread-safe; grpc.aio has neither problem: docs/operations.md, "Embedded services".)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from modpipe.serving.repository import ENSEMBLE_MODEL, TEXT_MODEL
from modpipe.textmodel.artifacts import SPAM_INDEX

MAX_BATCH = 128  # max_batch_size of spam_text in every config.pbtxt


class TritonError(RuntimeError):
    """Triton answered with an error or could not be reached."""


def spam_probability(logits: np.ndarray) -> np.ndarray:
    """Softmax over the two logits, probability of index 1 (spam), float64 for stable comparisons."""
    logits = np.asarray(logits, dtype=np.float64).reshape(-1, 2)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp[:, SPAM_INDEX] / exp.sum(axis=1)


@dataclass(frozen=True)
class ModelVersion:
    """Which model produced a score: written into every decision."""
    model: str
    triton_version: str
    build_version: str

    def as_dict(self) -> dict[str, str]:
        return {"model": self.model, "triton_version": self.triton_version, "build_version": self.build_version}


class TextModelClient:
    """Async client of spam_text (client-side tokenized input) and spam_text_ensemble (raw text)."""

    def __init__(self, url: str, model_name: str = TEXT_MODEL, timeout_s: float = 10.0,
                 ensemble_name: str = ENSEMBLE_MODEL):
        self.url = url
        self.model_name = model_name
        self.ensemble_name = ensemble_name
        self.timeout_s = timeout_s
        self._client: grpcclient.InferenceServerClient | None = None
        self._version: ModelVersion | None = None

    @property
    def client(self) -> grpcclient.InferenceServerClient:
        # Created lazily, inside the running loop that will use it (a grpc.aio channel is bound to one loop).
        if self._client is None:
            self._client = grpcclient.InferenceServerClient(self.url)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __aenter__(self) -> TextModelClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def ready(self) -> bool:
        try:
            return bool(await self.client.is_server_ready() and await self.client.is_model_ready(self.model_name))
        except InferenceServerException:
            return False

    async def model_version(self) -> ModelVersion:
        """Model name, Triton version directory and the build version (config parameter set by the launcher)."""
        if self._version is None:
            try:
                meta = await self.client.get_model_metadata(self.model_name, as_json=True)
                config = (await self.client.get_model_config(self.model_name, as_json=True))["config"]
            except InferenceServerException as exc:
                raise TritonError(f"model {self.model_name} at {self.url}: {exc}") from exc
            versions = meta.get("versions") or ["1"]
            build = config.get("parameters", {}).get("build_version", {}).get("string_value", "unknown")
            self._version = ModelVersion(self.model_name, str(max(versions, key=int)), build)
        return self._version

    async def model_versions(self) -> dict[str, str]:
        return (await self.model_version()).as_dict()

    async def _infer(self, model: str, inputs: list, outputs: list[str]) -> list[np.ndarray]:
        try:
            result = await self.client.infer(model, inputs,
                                             outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
                                             client_timeout=self.timeout_s)
        except InferenceServerException as exc:
            raise TritonError(f"{model} at {self.url}: {exc}") from exc
        return [result.as_numpy(o) for o in outputs]

    async def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """[n, seq] int64 inputs -> [n, 2] float32 logits; batches above 128 rows go as several requests."""
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        mask = np.ascontiguousarray(attention_mask, dtype=np.int64)
        if ids.shape != mask.shape or ids.ndim != 2:
            raise ValueError(f"input_ids {ids.shape} and attention_mask {mask.shape} must be the same [batch, seq]")
        if ids.shape[0] == 0:
            return np.zeros((0, 2), dtype=np.float32)
        if ids.shape[1] == 0:
            ids = np.zeros((ids.shape[0], 1), dtype=np.int64)
            mask = np.zeros_like(ids)
        chunks = []
        for start in range(0, ids.shape[0], MAX_BATCH):
            part_ids, part_mask = ids[start:start + MAX_BATCH], mask[start:start + MAX_BATCH]
            a = grpcclient.InferInput("input_ids", list(part_ids.shape), "INT64")
            a.set_data_from_numpy(part_ids)
            b = grpcclient.InferInput("attention_mask", list(part_mask.shape), "INT64")
            b.set_data_from_numpy(part_mask)
            chunks.append(self._infer(self.model_name, [a, b], ["logits"]))
        results = await asyncio.gather(*chunks)
        return np.concatenate([r[0] for r in results], axis=0)

    async def spam_probabilities(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Spam probability (softmax of the logits, index 1) of each row; empty in, empty out."""
        return spam_probability(await self.logits(input_ids, attention_mask))

    async def spam_probabilities_text(self, texts: Sequence[str]) -> np.ndarray:
        """Raw texts through the ensemble (tokenized on the server): the served probability, the build's
        lexical stack included."""
        return (await self._ensemble(texts, "spam_probability")).reshape(-1).astype(np.float64)

    async def model_probabilities_text(self, texts: Sequence[str]) -> np.ndarray:
        """Raw texts through the ensemble: the transformer's probability alone (softmax of its logits), what
        `spam_probabilities` gives for the client's own tokenization."""
        return spam_probability(await self._ensemble(texts, "logits"))

    async def _ensemble(self, texts: Sequence[str], output: str) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, 2 if output == "logits" else 1), dtype=np.float32)
        chunks = []
        for start in range(0, len(texts), MAX_BATCH):
            part = np.array([t.encode("utf-8") for t in texts[start:start + MAX_BATCH]], dtype=np.object_)
            part = part.reshape(-1, 1)
            inp = grpcclient.InferInput("text", list(part.shape), "BYTES")
            inp.set_data_from_numpy(part)
            chunks.append(self._infer(self.ensemble_name, [inp], [output]))
        results = await asyncio.gather(*chunks)
        return np.concatenate([r[0] for r in results])


class SyncTextModelClient:
    """Blocking facade over TextModelClient with its own event loop (CLI, tests). Not thread-safe."""

    def __init__(self, url: str, model_name: str = TEXT_MODEL, timeout_s: float = 10.0):
        self._loop = asyncio.new_event_loop()
        self._async = TextModelClient(url, model_name=model_name, timeout_s=timeout_s)

    def _run(self, coro):
        return self._loop.run_until_complete(coro)

    def ready(self) -> bool:
        return self._run(self._async.ready())

    def model_versions(self) -> dict[str, str]:
        return self._run(self._async.model_versions())

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self._run(self._async.logits(input_ids, attention_mask))

    def spam_probabilities(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self._run(self._async.spam_probabilities(input_ids, attention_mask))

    def spam_probabilities_text(self, texts: Sequence[str]) -> np.ndarray:
        return self._run(self._async.spam_probabilities_text(texts))

    def model_probabilities_text(self, texts: Sequence[str]) -> np.ndarray:
        return self._run(self._async.model_probabilities_text(texts))

    def close(self) -> None:
        if not self._loop.is_closed():
            self._run(self._async.close())
            self._loop.close()

    def __enter__(self) -> SyncTextModelClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
