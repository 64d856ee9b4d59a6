# syntax=docker/dockerfile:1.7
# hetero-infer operator: `hetero-infer operator` (kopf) without the engine's heavy dependencies: the
# package itself without dependencies, plus the `operator` extra of pyproject.toml (everything the
# operator's modules import), at the versions of docker/operator-constraints.txt. The router
# (`hetero-infer router`, spec.router) runs from this image too: ROUTER_TOKENIZER_REQUIREMENTS let it load
# the workers' tokenizer (GET /v1/tokenizer/files) for exact prefix hashes: transformers, tokenizers and
# jinja2 (chat templates), still no torch: the last RUN imports the router's tokenizer path, which fails here
# if anything on it needs the engine's dependencies.
#   docker build -f docker/operator.Dockerfile -t hetero-infer/operator:0.1.0 .
# PYTHON_IMAGE: any Debian/Ubuntu-like image with python3 (3.11+) and its venv module (a mirror, a local base).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG ROUTER_TOKENIZER_REQUIREMENTS="transformers tokenizers jinja2 pydantic"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin app

WORKDIR /src
# The dependencies first (their layer survives changes to the package's code), then the package.
COPY pyproject.toml docker/operator-constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['operator']))" > /tmp/operator-requirements.txt \
 && pip install -r /tmp/operator-requirements.txt ${ROUTER_TOKENIZER_REQUIREMENTS} -c operator-constraints.txt \
 && rm /tmp/operator-requirements.txt
COPY README.md ./
COPY hetero_infer ./hetero_infer
COPY worker ./worker
COPY kernels ./kernels
COPY operator ./operator
COPY router ./router
RUN pip install --no-deps . \
 && rm -rf /src \
 && cd / && hetero-infer operator --help > /dev/null && hetero-infer router --help > /dev/null \
 && python -c "import hetero_infer.router.app, hetero_infer.router.prompt, hetero_infer.contracts.chat_prompt, hetero_infer.contracts.tokenizer"

WORKDIR /
ENV HOME=/tmp
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["hetero-infer"]
CMD ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
