"""spam_postprocess: logits [batch, 2] -> spam_probability [batch, 1] (softmax, index 1 = spam), logits_out.

A separate step so that the ensemble works unchanged over both spam_text variants (the CPU python
model and the GPU TensorRT plan, which can only emit logits).
"""

import numpy as np
import triton_python_backend_utils as pb_utils

# numpy 1 and 2 in the stub's environment: inputs through DLPack (as_numpy() is wrong under numpy 2), outputs
# through DLPack under numpy 2 only (the plain constructor returns empty tensors there; DLPack kills a numpy 1
# stub). Measured with Triton 2.51's stub; spam_text's model.py has the same two rules.
_NUMPY2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"


def _out(name, array):
    array = np.require(array, requirements=["C", "W", "O"])
    return pb_utils.Tensor.from_dlpack(name, array) if _NUMPY2 else pb_utils.Tensor(name, array)


def spam_probability(logits):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return (exp[:, 1] / exp.sum(axis=1)).astype(np.float32).reshape(-1, 1)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "logits"))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                _out("spam_probability", spam_probability(logits)),
                _out("logits_out", np.array(logits, dtype=np.float32))]))
        return responses
