"""spam_postprocess: (logits [batch, 2], text [batch, 1]) -> spam_probability [batch, 1], logits_out.

The served probability is the transformer's (softmax, index 1 = spam) through the build's lexical stack: a
word model's margin on the text and a logistic regression on the two (modpipe/textmodel/lexical.py, which the
launcher copies beside this file with the build's `lexical_head.json` and `tokenizer.json`: one implementation
for the worker, the offline scorers and this model). A build without `lexical_head.json` serves the softmax.

The character head's margins come from `charhead.py` (copied beside it too): the same margins in numpy over
the whole request, ~5x faster than lexical.py's loop. The text comes normalised from spam_tokenizer
(`normalized`) in the ensemble; without that input it is normalised here.

A separate step so that the ensemble works unchanged over both spam_text variants (the CPU python model and
the GPU TensorRT plan, which can only emit logits).
"""

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

# numpy 1 and 2 in the stub's environment: inputs through DLPack (as_numpy() is wrong under numpy 2), outputs
# through DLPack under numpy 2 only (the plain constructor returns empty tensors there; DLPack kills a numpy 1
# stub). Measured with Triton 2.51's stub; spam_text's model.py has the same two rules. The `text` input is
# TYPE_STRING, which needs numpy < 2 (spam_tokenizer's model.py says why).
_NUMPY2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"


def _out(name, array):
    array = np.require(array, requirements=["C", "W", "O"])
    return pb_utils.Tensor.from_dlpack(name, array) if _NUMPY2 else pb_utils.Tensor(name, array)


def spam_probability(logits):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp[:, 1] / exp.sum(axis=1)


def _strings(tensor):
    raw = tensor.as_numpy().reshape(-1)
    return [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t) for t in raw]


class TritonPythonModel:
    def initialize(self, args):
        here = os.path.join(args["model_repository"], args["model_version"])
        self.stack = None
        if os.path.exists(os.path.join(here, "lexical.py")):
            sys.path.insert(0, here)
            import lexical  # noqa: PLC0415 - copied in by the launcher, found only once the path is set

            self.stack = lexical.StackedScorer.load(here)
            self.margins = self.stack.head.margins
            if os.path.exists(os.path.join(here, "charhead.py")):
                import charhead  # noqa: PLC0415 - as lexical

                fast = charhead.CharHead.of(self.stack.head)
                if fast is not None:
                    self.margins = fast.margins

    def execute(self, requests):
        responses = []
        for request in requests:
            logits = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "logits"))
            proba = spam_probability(logits)
            if self.stack is not None:
                given = pb_utils.get_input_tensor_by_name(request, "normalized")
                if given is not None:
                    normalized = _strings(given)
                else:
                    normalized = self.stack.normalized(_strings(pb_utils.get_input_tensor_by_name(request, "text")))
                served = 1.0 / (1.0 + np.exp(-self.stack.decision(proba, self.margins(normalized))))
                proba = np.where(np.isnan(proba), np.nan, served)  # as StackedScorer.spam_proba
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                _out("spam_probability", proba.astype(np.float32).reshape(-1, 1)),
                _out("logits_out", np.array(logits, dtype=np.float32))]))
        return responses
