"""spam_postprocess: logits [batch, 2] -> spam_probability [batch, 1] (softmax, index 1 = spam), logits_out.

A separate step so that the ensemble works unchanged over both spam_text variants (the CPU python
model and the GPU TensorRT plan, which can only emit logits).
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def spam_probability(logits):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return (exp[:, 1] / exp.sum(axis=1)).astype(np.float32).reshape(-1, 1)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("spam_probability", spam_probability(logits)),
                pb_utils.Tensor("logits_out", np.ascontiguousarray(logits, dtype=np.float32))]))
        return responses
