# Model artifact image: one text-model build, versioned by its tag, copied into emptyDirs by the init
# containers of the workers (`/model/build`) and of Triton (`/model/triton-gpu`). No weights enter the
# worker image or git; no ReadWriteMany volume is needed. Build context = the directory written by
# deploy/docker/model-context.sh:
#   deploy/docker/model-context.sh /tmp/model-ctx
#   docker build -f deploy/docker/model.Dockerfile -t REGISTRY/modpipe/model:<build version> /tmp/model-ctx
FROM busybox:1.36
COPY build/ /model/build/
COPY triton-gpu/ /model/triton-gpu/
USER 65534:65534
CMD ["ls", "-lR", "/model"]
