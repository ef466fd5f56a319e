# syntax=docker/dockerfile:1
# modpipe worker image: `modpipe worker` (default), `modpipe topics`, `modpipe config`, ...
# Serving dependencies only: no `build` extra (torch, onnx export), no model weights - the model build
# comes from the model artifact image (deploy/docker/model.Dockerfile) at pod start.
#   docker build -t REGISTRY/modpipe/worker:$(git describe --always) .

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependency layer first: only pyproject.toml and constraints.txt go in, so a code change reuses it. The
# runtime requirements are read from pyproject.toml (no extras) and installed at their pins.
COPY pyproject.toml constraints.txt ./
RUN pip install --upgrade pip \
 && python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt
# Then the code: the package itself, its dependencies already there.
COPY README.md ./
COPY modpipe/ modpipe/
COPY streams/ streams/
COPY features/ features/
COPY loadgen/ loadgen/
COPY simulation/ simulation/
COPY console/ console/
RUN pip install --no-deps -c constraints.txt . \
 && python -m compileall -q /opt/venv

FROM python:3.11-slim
# libgomp1: OpenMP runtime of lightgbm / onnxruntime wheels; ca-certificates: TLS to Kafka
# (KAFKA_SSL_CAFILE=/etc/ssl/certs/ca-certificates.crt in the prod overlay).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 modpipe \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/modpipe --shell /usr/sbin/nologin modpipe \
 && mkdir -p /var/lib/modpipe /opt/modpipe/model \
 && chown -R 10001:10001 /var/lib/modpipe /opt/modpipe
COPY --from=build /opt/venv /opt/venv
# Templates of the Triton model repository, so `modpipe triton export` works from this image too.
COPY triton_models/ /opt/modpipe/triton_models/
# MALLOC_ARENA_MAX: glibc gives each thread (librdkafka has several) an arena of its own that keeps what it
# freed; with two, the worker's `malloc_trim` (streams/worker.py) reaches nearly all of it (docs/features.md).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MODPIPE_TRITON_REPO_SRC=/opt/modpipe/triton_models \
    MODPIPE_STATE_DIR=/var/lib/modpipe \
    MODPIPE_CACHE_DIR=/tmp/modpipe-cache \
    MODPIPE_METRICS_HOST=0.0.0.0 \
    MALLOC_ARENA_MAX=2
WORKDIR /var/lib/modpipe
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["modpipe"]
CMD ["worker"]
