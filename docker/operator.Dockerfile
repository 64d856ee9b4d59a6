# syntax=docker/dockerfile:1.7
# hetero-infer operator: `hetero-infer operator` (kopf) without the engine's heavy dependencies
# (no torch: the operator package imports only kopf, kubernetes and the standard library).
#   docker build -f docker/operator.Dockerfile -t hetero-infer/operator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY hetero_infer ./hetero_infer
COPY worker ./worker
COPY kernels ./kernels
COPY operator ./operator
RUN python -m venv /opt/venv \
 && pip install --no-deps . \
 && pip install "kopf==1.45.2" "kubernetes==37.0.2" "pyyaml==6.0.3" \
 && rm -rf /src \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin app \
 && hetero-infer operator --help > /dev/null

WORKDIR /
ENV HOME=/tmp
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["hetero-infer"]
CMD ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
