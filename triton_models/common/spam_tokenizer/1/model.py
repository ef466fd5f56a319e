"""spam_tokenizer: raw UTF-8 text -> (input_ids, attention_mask, normalized) with the build's fast tokenizer.

Each request is padded to its own longest text (not to max_seq_len), and a text longer than the window
keeps its first max_seq_len - tail_tokens and last tail_tokens tokens, exactly like the client-side
`modpipe.textmodel.tokenize.BatchTokenizer`, so the ensemble and client-side tokenization give the
same model inputs (this file runs inside Triton, where modpipe is not installed, hence the copy).
Texts that are not valid UTF-8 are decoded with replacement characters.

`normalized` is each text as the tokenizer's normalizer leaves it, what spam_postprocess's lexical stack reads:
the normaliser (a third of the text path's CPU) runs once a text, and the ids come from the normalised text as
`BatchTokenizer.encode_normalized` makes them (an added token typed in the raw text, matched before
normalisation, sends that text through the whole tokenizer instead).

The launcher links the build's `tokenizer.json` into this version directory.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

# The `text` input is TYPE_STRING, which Triton 2.51's stub cannot read under numpy 2 at all (it fails while
# loading the request, before execute()): this model needs numpy < 2 in the stub's environment. Its numeric
# outputs follow the rule that works under both (spam_text's model.py explains it).
# A long text's prefix of this many characters a token usually fills the window (English ~4-5 characters a
# token; hostile text fewer): see _encode_cut.
CHARS_PER_TOKEN = 8
_NUMPY2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"


def _out(name, array):
    array = np.require(array, requirements=["C", "W", "O"])
    return pb_utils.Tensor.from_dlpack(name, array) if _NUMPY2 else pb_utils.Tensor(name, array)


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value not in ("", None) else default


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        here = os.path.join(args["model_repository"], args["model_version"])
        path = os.path.join(here, _param(config, "tokenizer_file", "tokenizer.json"))
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(f"no tokenizer at {path}: run `modpipe model build`")
        self.max_len = int(_param(config, "max_seq_len", "128"))
        self.tail = min(int(_param(config, "tail_tokens", "0")), self.max_len // 2)
        self.tok = self._prepared(path)
        self.normalizer = self.tok.normalizer
        self.prenormalized = self._prepared(path)
        self.prenormalized.normalizer = None
        self.raw_matched = tuple(t.content for t in self.tok.get_added_tokens_decoder().values() if not t.normalized)
        pad = self.tok.token_to_id("[PAD]")
        self.pad_id = int(pad) if pad is not None else 0

    def _prepared(self, path):
        tok = Tokenizer.from_file(path)
        tok.no_padding()
        if self.tail > 0:
            tok.no_truncation()  # the head and the tail are cut from the full encoding
        else:
            tok.enable_truncation(max_length=self.max_len)
        return tok

    def _window(self, seq):
        if self.tail <= 0 or len(seq) <= self.max_len:
            return seq
        return seq[:self.max_len - self.tail] + seq[len(seq) - self.tail:]

    def _encode_cut(self, normalized):
        """Ids of normalised texts. Without a tail only the first max_seq_len tokens count, so a long text is
        encoded from a prefix cut at a space (words, and so their tokens, are split at spaces): when that prefix
        fills the window its ids are the whole text's; when it does not, the whole text is encoded. Saves ~1/3
        of WordPiece's time on the test texts (678 characters on average), same ids."""
        if self.tail > 0:
            return [self._window(e.ids) for e in self.prenormalized.encode_batch(normalized)]
        limit = CHARS_PER_TOKEN * self.max_len
        cuts = []
        for text in normalized:
            at = text.rfind(" ", 0, limit) if len(text) > limit else -1
            cuts.append(text[:at] if at > 0 else text)
        seqs = [e.ids for e in self.prenormalized.encode_batch(cuts)]
        short = [i for i, seq in enumerate(seqs) if len(seq) < self.max_len and len(cuts[i]) < len(normalized[i])]
        for i, e in zip(short, self.prenormalized.encode_batch([normalized[i] for i in short]), strict=True):
            seqs[i] = e.ids
        return seqs

    def _encode(self, texts):
        if self.normalizer is None:
            normalized = list(texts)
        else:
            normalize = self.normalizer.normalize_str
            normalized = [normalize(t) for t in texts]
        seqs = self._encode_cut(normalized)
        for i, text in enumerate(texts):
            if any(token in text for token in self.raw_matched):
                seqs[i] = self._window(self.tok.encode(text).ids)
        width = max([len(s) for s in seqs] + [1])
        ids = np.full((len(seqs), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for row, seq in enumerate(seqs):
            ids[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1
        return ids, mask, normalized

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            texts = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t) for t in raw]
            ids, mask, normalized = self._encode(texts)
            norm = np.array([t.encode("utf-8") for t in normalized], dtype=np.object_).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                _out("input_ids", ids), _out("attention_mask", mask), pb_utils.Tensor("normalized", norm)]))
        return responses
