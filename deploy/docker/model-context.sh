#!/usr/bin/env bash
# Writes the build context of deploy/docker/model.Dockerfile for one text-model build:
#   OUT/build/       model.onnx, tokenizer.json, served.json (+ MODEL_CARD.md): MODPIPE_MODEL_DIR of workers
#   OUT/build/decision/  the LightGBM decision model trained on that text model (model.txt + model.json):
#                    MODPIPE_DECISION_MODEL of workers
#   OUT/triton-gpu/  `modpipe triton export --variant tensorrt`: Triton repository, spam_text/1/model.onnx;
#                    Triton's init container builds model.plan from it on the serving GPU (from the
#                    fp32 export: TensorRT cannot parse the int8 one).
# The build is MODPIPE_MODEL_DIR if set, else the newest full build in the cache (as `modpipe` resolves it).
# Usage: deploy/docker/model-context.sh OUT   (run with the repo's venv active, or MODPIPE=path/to/modpipe)
set -euo pipefail
OUT="${1:?usage: $0 OUT}"
PY="${PYTHON:-python}"
MODPIPE="${MODPIPE:-modpipe}"
BUILD="$("$PY" -c 'from modpipe.settings import Settings
from modpipe.textmodel.artifacts import resolve_model
print(resolve_model(Settings.from_env()).path)')"
VERSION="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$BUILD/served.json")"
rm -rf "$OUT"
mkdir -p "$OUT/build"
cp -L "$BUILD/model.onnx" "$BUILD/tokenizer.json" "$BUILD/served.json" "$OUT/build/"
[ -f "$BUILD/MODEL_CARD.md" ] && cp -L "$BUILD/MODEL_CARD.md" "$OUT/build/"
DECISION="$("$PY" -c 'import sys
from modpipe.settings import Settings
from modpipe.decision.train import resolve_decision_model
print(resolve_decision_model(Settings.from_env(), sys.argv[1]))' "$VERSION")"
if [ ! -f "$DECISION/model.txt" ]; then
  echo "no decision model at $DECISION: run \`modpipe decision train\` first" >&2; exit 1
fi
mkdir -p "$OUT/build/decision"
cp -L "$DECISION/model.txt" "$DECISION/model.json" "$OUT/build/decision/"
MODPIPE_MODEL_DIR="$BUILD" "$MODPIPE" triton export --variant tensorrt --out "$OUT/triton-gpu"
rm -f "$OUT/triton-gpu-build_engine.sh"   # the Triton pod's init container runs trtexec itself
# TensorRT cannot parse the dynamically quantized int8 export (MatMulInteger, DynamicQuantizeLinear):
# when the build serves int8 on CPU, give trtexec the fp32 export (the engine is built with --fp16).
if [ -f "$BUILD/model.fp32.onnx" ]; then
  cp -L "$BUILD/model.fp32.onnx" "$OUT/triton-gpu/spam_text/1/model.onnx"
fi
chmod -R a+rX "$OUT"
echo "context $OUT for build $VERSION; next:"
echo "  docker build -f deploy/docker/model.Dockerfile -t REGISTRY/modpipe/model:$VERSION $OUT"
