# syntax=docker/dockerfile:1.7
# hetero-infer operator: `hetero-infer operator` (kopf) without the engine's heavy dependencies: the
# package itself without dependencies, plus the `operator` extra of pyproject.toml (everything the
# operator's modules import), at the versions of docker/operator-constraints.txt.
#   docker build -f docker/operator.Dockerfile -t hetero-infer/operator:0.1.0 .
# PYTHON_IMAGE: any Debian/Ubuntu-like image with python3 (3.11+) and its venv module (a mirror, a local base).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin app

WORKDIR /src
COPY pyproject.toml README.md docker/operator-constraints.txt ./
COPY hetero_infer ./hetero_infer
COPY worker ./worker
COPY kernels ./kernels
COPY operator ./operator
COPY router ./router
RUN pip install --no-deps . \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['operator']))" > /tmp/operator-requirements.txt \
 && pip install -r /tmp/operator-requirements.txt -c operator-constraints.txt \
 && rm -rf /src /tmp/operator-requirements.txt \
 && cd / && hetero-infer operator --help > /dev/null

WORKDIR /
ENV HOME=/tmp
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["hetero-infer"]
CMD ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
