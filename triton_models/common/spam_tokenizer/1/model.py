"""spam_tokenizer: raw UTF-8 text -> (input_ids, attention_mask) with the build's fast tokenizer.

Each request is padded to its own longest text (not to max_seq_len), exactly like the client-side
`modpipe.textmodel.tokenize.BatchTokenizer`, so the ensemble and client-side tokenization give the
same model inputs. Texts that are not valid UTF-8 are decoded with replacement characters.

The launcher links the build's `tokenizer.json` into this version directory.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


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
        self.tok = Tokenizer.from_file(path)
        self.tok.enable_truncation(max_length=self.max_len)
        self.tok.no_padding()
        pad = self.tok.token_to_id("[PAD]")
        self.pad_id = int(pad) if pad is not None else 0

    def _encode(self, texts):
        encodings = self.tok.encode_batch(texts)
        width = max([len(e.ids) for e in encodings] + [1])
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
        return ids, mask

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            texts = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t) for t in raw]
            ids, mask = self._encode(texts)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]))
        return responses
