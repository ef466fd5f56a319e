# syntax=docker/dockerfile:1
# modpipe worker image: `modpipe worker` (default), `modpipe topics`, `modpipe config`, ...
# The core dependencies and the worker's code only: no extra (no local stack, training, console, load
# generator), no model weights - the model build comes from the model artifact image
# (deploy/docker/model.Dockerfile) at pod start. The Triton templates are inside the package.
#   docker build -t REGISTRY/modpipe/worker:$(git describe --always) .

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependency layer first: only the lock goes in, so a code change reuses it. requirements/worker.lock holds the
# core dependencies of pyproject.toml (no extra) at the pins of constraints.txt, each with its hashes (`make lock`).
COPY requirements/worker.lock requirements/
RUN pip install --upgrade pip \
 && pip install --require-hashes --no-deps -r requirements/worker.lock
# Then the code: the package itself, its dependencies already there. setuptools needs every folder that
# pyproject maps; what a worker never imports is removed from site-packages after the install.
COPY pyproject.toml README.md LICENSE ./
COPY modpipe/ modpipe/
COPY streams/ streams/
COPY features/ features/
COPY triton_models/ triton_models/
COPY loadgen/ loadgen/
COPY simulation/ simulation/
COPY console/ console/
RUN pip install --no-deps . \
 && site=$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
 && rm -rf "$site/modpipe/loadgen" "$site/modpipe/simulation" "$site/modpipe/console" "$site/modpipe/evaluation" \
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
# MALLOC_ARENA_MAX: glibc gives each thread (librdkafka has several) an arena of its own that keeps what it
# freed; with two, the worker's `malloc_trim` (streams/worker.py) reaches nearly all of it (docs/features.md).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MODPIPE_STATE_DIR=/var/lib/modpipe \
    MODPIPE_CACHE_DIR=/tmp/modpipe-cache \
    MODPIPE_METRICS_HOST=0.0.0.0 \
    MALLOC_ARENA_MAX=2
WORKDIR /var/lib/modpipe
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["modpipe"]
CMD ["worker"]
