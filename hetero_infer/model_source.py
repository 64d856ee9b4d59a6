"""Where a model comes from: a model reference resolved into a local folder, downloaded once into a cache.

References: a local folder or `.gguf` file; `hf://ORG/NAME[@REVISION]` (or a bare `ORG/NAME` that is not a
local path, as vLLM accepts) from the Hugging Face Hub through huggingface_hub, into its cache, with its
standard environment (HF_ENDPOINT, HF_TOKEN, HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE); `s3://BUCKET/PREFIX` from
an S3-compatible store through boto3 (the `s3` extra), with the standard AWS variables (AWS_ENDPOINT_URL /
AWS_ENDPOINT_URL_S3, keys, region, profile), into `model_cache_dir()/s3/BUCKET/PREFIX`.

Only the files a model needs are fetched (`select_model_files`). A LoRA adapter (`adapter=True`: a PEFT folder,
`adapter_config.json` and its safetensors) comes from the same sources into the same caches. A source that cannot be reached falls back to
the cache; a missing repository, prefix or revision and a 401/403 are one ModelSourceError line naming the
source. Secrets (tokens, keys, URL passwords) never reach a message. Torch-free: the operator's download Job
reuses it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hetero_infer.paths import model_cache_dir
from hetero_infer.progress import DEFAULT_INTERVAL_S, Progress, human_bytes, library_bars_off

logger = logging.getLogger("hetero_infer.model_source")

SCHEMES = ("hf", "s3")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # ORG/NAME
_HF_REPO = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")  # hf:// also takes legacy names (gpt2)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Top-level files a model needs besides its safetensors (tokenizers: fast, sentencepiece, BPE, tiktoken).
_NEEDED_SUFFIXES = (".json", ".jinja", ".tiktoken")
_NEEDED_NAMES = frozenset({"tokenizer.model", "merges.txt", "vocab.txt", "spiece.model"})
_SECRET_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                     "AWS_ACCESS_KEY_ID")
_URL_PASSWORD = re.compile(r"(?<=://)[^/@\s]+@")
_S3_MANIFEST = ".source.json"
MODEL_CONFIG, ADAPTER_CONFIG = "config.json", "adapter_config.json"  # what a model's / an adapter's folder holds


# The HTTP clients huggingface_hub uses log every request at INFO (httpx; httpx2 from huggingface_hub 2.x).
HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore")


def quiet_http_client_logs() -> None:
    """Keep the per-request lines of the Hub's HTTP client out of INFO logs (its errors still show)."""
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class ModelSourceError(Exception):
    """A model reference that cannot be resolved: one line naming the source and the reason. `permanent`: no retry
    can help (not found, access denied, not a model); `hetero-infer fetch` then exits EXIT_PERMANENT, on which the
    operator's download Job fails at once (its podFailurePolicy) instead of retrying for minutes."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


EXIT_PERMANENT = 3  # `hetero-infer fetch`'s status for a ModelSourceError that is permanent (1: worth a retry)


@dataclass(frozen=True)
class ModelRef:
    scheme: Literal["local", "hf", "s3"]
    location: str  # the path, the repository id or the bucket
    prefix: str = ""  # s3: the key prefix, without a trailing slash
    revision: str | None = None  # hf: a branch, tag or commit; None: main

    def __str__(self) -> str:
        if self.scheme == "hf":
            return f"hf://{self.location}" + (f"@{self.revision}" if self.revision else "")
        if self.scheme == "s3":
            return f"s3://{self.location}/{self.prefix}".rstrip("/")
        return self.location

    @property
    def name(self) -> str:
        """The name a server answers to: the repository id (as vLLM does), the prefix's last part, the file's."""
        if self.scheme == "hf":
            return self.location
        if self.scheme == "s3":
            return self.prefix.rsplit("/", 1)[-1] or self.location
        path = Path(self.location)
        return path.stem if path.suffix.lower() == ".gguf" else path.name


def parse_model_ref(value: str | os.PathLike) -> ModelRef:
    """A model reference from `--model`/`LLM(model)`; ModelSourceError for an unknown scheme or a malformed URL."""
    text = os.fspath(value)
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme == "hf":
            repo, at, revision = rest.partition("@")
            repo = repo.strip("/")
            if not _HF_REPO.fullmatch(repo) or (at and not revision):
                raise ModelSourceError(f"malformed model URL {redact(text)!r}: expected hf://ORG/NAME[@REVISION]")
            return ModelRef("hf", repo, revision=revision or None)
        if scheme == "s3":
            bucket, _, prefix = rest.partition("/")
            if not _BUCKET.fullmatch(bucket):
                raise ModelSourceError(f"malformed model URL {redact(text)!r}: expected s3://BUCKET/PREFIX")
            return ModelRef("s3", bucket, prefix=prefix.strip("/"))
        raise ModelSourceError(
            f"unsupported model URL scheme {scheme + '://'!r} in {redact(text)!r}: use a local path, "
            "hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX")
    if not Path(text).expanduser().exists() and _REPO_ID.fullmatch(text):
        return ModelRef("hf", text)
    return ModelRef("local", str(Path(text).expanduser()))


def fetch_model(value: str | os.PathLike | ModelRef, *, interval: float = DEFAULT_INTERVAL_S,
                weights: bool = True, adapter: bool = False) -> tuple[Path, str]:
    """(local path, served name) for a model reference: local paths as given, remote ones from the cache,
    downloaded first where the cache lacks them (progress every `interval` seconds). `weights` False fetches
    the configs and tokenizer only (`load_format="dummy"` reads no weights). `adapter`: a PEFT LoRA adapter
    (adapter_config.json) rather than a model (config.json)."""
    ref = value if isinstance(value, ModelRef) else parse_model_ref(value)
    marker = ADAPTER_CONFIG if adapter else MODEL_CONFIG
    if ref.scheme == "hf":
        try:
            return fetch_hf(ref, interval=interval, weights=weights, marker=marker), ref.name
        except ModelSourceError as exc:
            if isinstance(value, ModelRef) or "://" in os.fspath(value):
                raise
            raise ModelSourceError(f"{exc} (nor is there a local folder {value})") from None
    if ref.scheme == "s3":
        return fetch_s3(ref, interval=interval, weights=weights, marker=marker), ref.name
    return Path(ref.location), ref.name


def select_model_files(files: Mapping[str, int], weights: bool = True) -> list[str]:
    """The files (path -> size) of a repository or prefix that a model needs: top-level configs, tokenizer files
    and safetensors (only `model*.safetensors` with its index where the repository has them, so a second copy such
    as Mistral's consolidated.safetensors is not fetched); never .bin, .pth, ONNX or GGUF variants, nor folders.
    Without `weights`, no safetensors at all."""
    top = [name for name in files if "/" not in name]
    chosen = [n for n in top if n.endswith(_NEEDED_SUFFIXES) or n in _NEEDED_NAMES]
    if not weights:
        return sorted(chosen)
    tensors = [n for n in top if n.endswith(".safetensors")]
    standard = [n for n in tensors if n.startswith("model")]
    return sorted(set(chosen) | set(standard or tensors))


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` without the secrets of the environment and without passwords in URLs."""
    env = os.environ if environ is None else environ
    for name in _SECRET_VARIABLES:
        secret = env.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return _URL_PASSWORD.sub("***@", text)


def _check_model_files(ref: ModelRef, names: Iterable[str], weights: bool = True,
                       marker: str = MODEL_CONFIG) -> None:
    names = set(names)
    if marker not in names:
        what = "a PEFT adapter" if marker == ADAPTER_CONFIG else "a Hugging Face model"
        raise ModelSourceError(f"{ref}: no {marker} at its top level: not {what}", permanent=True)
    if weights and not any(n.endswith(".safetensors") for n in names):
        raise ModelSourceError(f"{ref}: no .safetensors weights (.bin/.pth checkpoints are not loaded)",
                               permanent=True)


def _folder_bytes(folder: Path) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file(follow_symlinks=False))
    except FileNotFoundError:
        return 0


def _download_line(ref: ModelRef, count: int, total: int, where: Path) -> str:
    return f"downloading {ref}: {count} file(s), {human_bytes(total)} into {where}"


# -- the Hugging Face Hub -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubSettings:
    """The Hub's standard environment, read when a model is fetched (huggingface_hub reads it at import)."""

    endpoint: str
    token: str | None
    cache: Path
    offline: bool

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HubSettings:
        env = os.environ if environ is None else environ
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
        cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
        offline = (env.get("HF_HUB_OFFLINE") or "").strip().lower() in ("1", "true", "yes", "on")
        return cls((env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/"),
                   env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None,
                   Path(cache).expanduser(), offline)


def _hub_error(ref: ModelRef, exc: BaseException) -> ModelSourceError | None:
    """The one-line error for a Hub answer that no cache can fix (None: the Hub could not be reached)."""
    from huggingface_hub.utils import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError):
        why = (f"access denied (HTTP {status}): a gated repository; accept its terms on the Hub and set HF_TOKEN "
               "to a token of an account that did")
    elif isinstance(exc, RepositoryNotFoundError):
        why = ("repository not found (HTTP 404)" if status == 404 else
               f"repository not found or not authorized (HTTP {status}): check the name, and set HF_TOKEN for "
               "a private repository")
    elif isinstance(exc, RevisionNotFoundError):
        why = f"revision {ref.revision or 'main'!r} not found"
    elif isinstance(exc, HfHubHTTPError) and status in (401, 403):
        why = f"access denied (HTTP {status}): HF_TOKEN is missing or has no access to it"
    elif isinstance(exc, HfHubHTTPError) and status is not None and status < 500 and status != 429:
        why = f"the Hub answered HTTP {status}"
    else:
        return None
    return ModelSourceError(redact(f"{ref}: {why}"), permanent=True)


def fetch_hf(ref: ModelRef, *, interval: float = DEFAULT_INTERVAL_S,
             settings: HubSettings | None = None, weights: bool = True, marker: str = MODEL_CONFIG) -> Path:
    """The snapshot folder of a Hub model in the Hub cache, downloading the files it lacks."""
    import huggingface_hub as hub
    from huggingface_hub.hf_api import RepoFile

    s = settings or HubSettings.from_env()
    revision = ref.revision or "main"
    if s.offline:  # asked for (a pod whose init container fetched the model): no warning
        return _cached_hf(ref, s, "HF_HUB_OFFLINE is set", level=logging.INFO, weights=weights, marker=marker)
    api = hub.HfApi(endpoint=s.endpoint, token=s.token)
    try:
        info = api.model_info(ref.location, revision=revision)
        files = {f.path: f.size for f in api.list_repo_tree(ref.location, revision=info.sha) if isinstance(f, RepoFile)}
    except Exception as exc:
        error = _hub_error(ref, exc)
        if error is not None:
            raise error from None
        return _cached_hf(ref, s, f"cannot reach {s.endpoint} ({type(exc).__name__})", weights=weights,
                          marker=marker)
    names = select_model_files(files, weights)
    _check_model_files(ref, names, weights, marker)
    storage = s.cache / f"models--{ref.location.replace('/', '--')}"
    snapshot = storage / "snapshots" / str(info.sha)
    missing = [n for n in names if not (snapshot / n).is_file()]
    total = sum(files[n] or 0 for n in missing)
    blobs = storage / "blobs"
    base = _folder_bytes(blobs)
    started = time.monotonic()
    if missing:
        logger.info("%s", redact(_download_line(ref, len(missing), total, s.cache)))
    report = Progress(str(ref), total, lambda: _folder_bytes(blobs) - base, interval=interval) if missing \
        else nullcontext()
    try:
        with report, library_bars_off(transformers=False):
            folder = hub.snapshot_download(ref.location, revision=revision, cache_dir=s.cache, token=s.token,
                                           endpoint=s.endpoint, allow_patterns=names)
    except Exception as exc:
        error = _hub_error(ref, exc)
        raise (error or ModelSourceError(redact(f"{ref}: download failed: {type(exc).__name__}: {exc}"))) from None
    if missing:
        logger.info("downloaded %s in %.1f s", ref, time.monotonic() - started)
    return Path(folder)


def _cached_hf(ref: ModelRef, s: HubSettings, reason: str, level: int = logging.WARNING,
               weights: bool = True, marker: str = MODEL_CONFIG) -> Path:
    import huggingface_hub as hub

    try:  # the snapshot of the revision's commit (refs/REVISION): found through its config
        folder = Path(hub.snapshot_download(ref.location, revision=ref.revision or "main", cache_dir=s.cache,
                                            local_files_only=True, allow_patterns=[marker]))
        _check_complete(ref, folder, weights, marker)
    except Exception as exc:  # not cached, or cached incompletely
        why = str(exc) if isinstance(exc, ModelSourceError) else type(exc).__name__
        raise ModelSourceError(redact(f"{ref}: {reason}, and it is not in the cache {s.cache} ({why})")) from None
    logger.log(level, "%s", redact(f"{ref}: {reason}; using the cached copy {folder}"))
    return folder


def _check_complete(ref: ModelRef, folder: Path, weights: bool = True, marker: str = MODEL_CONFIG) -> None:
    """A cached folder has a config and all its weights (each shard its index names)."""
    names = [p.name for p in folder.iterdir()]
    _check_model_files(ref, names, weights, marker)
    index = folder / "model.safetensors.index.json"
    if weights and index.is_file():
        shards = set(json.loads(index.read_text())["weight_map"].values())
        if not shards <= set(names):
            raise ModelSourceError(f"{ref}: the cached copy lacks {', '.join(sorted(shards - set(names)))}")


# -- S3-compatible stores -----------------------------------------------------------------------------------


def s3_cache_folder(ref: ModelRef) -> Path:
    return model_cache_dir() / "s3" / ref.location / ref.prefix


def _s3_error(ref: ModelRef, exc: BaseException) -> ModelSourceError | None:
    """The one-line error for an S3 answer that no cache can fix (None: the store could not be reached)."""
    from botocore.exceptions import ClientError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return ModelSourceError(f"{ref}: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                                "or a profile)", permanent=True)
    if not isinstance(exc, ClientError):
        return None
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in ("NoSuchBucket", "NoSuchKey") or status == 404:
        why = f"bucket {ref.location!r} not found" if code == "NoSuchBucket" else "not found"
    elif status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        why = f"access denied ({code or status}): check the AWS credentials and the bucket's policy"
    elif status is not None and status >= 500:
        return None
    else:
        why = f"the store answered {code or status}"
    return ModelSourceError(redact(f"{ref}: {why}"), permanent=True)


def _s3_client() -> Any:
    try:
        import boto3
    except ImportError:
        raise ModelSourceError("s3:// models need boto3: pip install 'hetero-infer[s3]'") from None
    return boto3.client("s3")  # endpoint, credentials, region: botocore's standard environment and files


def fetch_s3(ref: ModelRef, *, interval: float = DEFAULT_INTERVAL_S, client: Any = None,
             weights: bool = True, marker: str = MODEL_CONFIG) -> Path:
    """The cached copy of an S3 prefix's model files, downloading the files that are missing or changed."""
    client = client or _s3_client()
    target = s3_cache_folder(ref)
    manifest_path = target / _S3_MANIFEST
    prefix = f"{ref.prefix}/" if ref.prefix else ""
    try:
        objects = {o["Key"][len(prefix):]: o
                   for page in client.get_paginator("list_objects_v2").paginate(Bucket=ref.location, Prefix=prefix)
                   for o in page.get("Contents", [])}
    except Exception as exc:
        error = _s3_error(ref, exc)
        if error is not None:
            raise error from None
        if not manifest_path.is_file():
            raise ModelSourceError(redact(f"{ref}: cannot reach {client.meta.endpoint_url} "
                                          f"({type(exc).__name__}), and it is not in the cache {target}")) from None
        logger.warning("%s", redact(f"{ref}: cannot reach {client.meta.endpoint_url} ({type(exc).__name__}); "
                                    f"using the cached copy {target}"))
        return target
    if not objects:
        raise ModelSourceError(f"{ref}: no objects under this prefix", permanent=True)
    sizes = {k: o["Size"] for k, o in objects.items()}
    names = select_model_files(sizes, weights)
    _check_model_files(ref, names, weights, marker)
    wanted = {n: objects[n]["ETag"] for n in names}
    have = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    missing = [n for n in names if have.get(n) != wanted[n] or not (target / n).is_file()]
    if missing:
        _download_s3(ref, client, target, prefix, {n: int(objects[n]["Size"]) for n in missing}, interval)
        tmp = manifest_path.with_name(f"{_S3_MANIFEST}.{os.getpid()}")
        # entries of files this fetch did not ask for (the weights, after a dummy fetch) stay
        kept = {n: tag for n, tag in have.items() if n in objects and (target / n).is_file()}
        tmp.write_text(json.dumps({**kept, **wanted}, indent=1, sort_keys=True))
        os.replace(tmp, manifest_path)
    return target


def _download_s3(ref: ModelRef, client: Any, target: Path, prefix: str, sizes: dict[str, int],
                 interval: float) -> None:
    total = sum(sizes.values())
    logger.info("%s", redact(_download_line(ref, len(sizes), total, target)))
    target.mkdir(parents=True, exist_ok=True)
    done = [0]
    started = time.monotonic()

    def add(n: int) -> None:  # boto3 calls it from its transfer threads; a lost update only delays the line
        done[0] += n

    try:
        with Progress(str(ref), total, lambda: done[0], interval=interval):
            for name in sizes:
                tmp = target / f".{name}.part{os.getpid()}"
                try:
                    client.download_file(ref.location, prefix + name, str(tmp), Callback=add)
                    os.replace(tmp, target / name)
                finally:
                    tmp.unlink(missing_ok=True)
    except Exception as exc:
        error = _s3_error(ref, exc)
        raise (error or ModelSourceError(redact(f"{ref}: download failed: {type(exc).__name__}: {exc}"))) from None
    logger.info("downloaded %s in %.1f s", ref, time.monotonic() - started)


def check_tensor_split(name: str, folder: Path, world_size: int) -> None:
    """A permanent ModelSourceError, one line naming the model, `world_size` and what does not divide, when the
    model in `folder` (its config.json) cannot be split over `world_size` tensor-parallel ranks: the check the
    engine makes at start (worker/runner/parallel/checks.py), made where the model is downloaded, so that the
    operator reports it in the InferenceDeployment's status (ModelReady: CannotSplit) before any worker starts."""
    # Torch-free, but the worker's package: imported here only, as the operator imports this module.
    from hetero_infer.worker.runner.parallel.checks import split_problems

    config = folder / MODEL_CONFIG
    try:
        raw = json.loads(config.read_text())
        problems = split_problems(raw, world_size)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
        raise ModelSourceError(f"cannot split {name} {world_size} ways: cannot read {config}: "
                               f"{type(exc).__name__}: {exc}", permanent=True) from None
    if problems:
        raise ModelSourceError(f"cannot split {name} {world_size} ways: {'; '.join(problems)}", permanent=True)


def main(argv: list[str] | None = None) -> int:
    """`hetero-infer fetch MODEL`: fetch a model into the caches (the operator's init container); prints the
    local folder. Status 1 with one line when it cannot."""
    import argparse

    parser = argparse.ArgumentParser(prog="hetero-infer fetch", description=main.__doc__)
    parser.add_argument("model", help="hf://ORG/NAME[@REVISION], ORG/NAME or s3://BUCKET/PREFIX")
    parser.add_argument("--progress-interval", type=float, default=DEFAULT_INTERVAL_S,
                        help="seconds between progress lines when stderr is not a terminal")
    parser.add_argument("--gguf-dtype", choices=("float32", "bfloat16"), default=None,
                        help="convert a .gguf model once into a Hugging Face folder of this dtype (in "
                             "HETERO_INFER_MODEL_CACHE; needs the worker's dependencies) and print that folder")
    parser.add_argument("--adapter", action="store_true",
                        help="a PEFT LoRA adapter (adapter_config.json and its safetensors) rather than a model")
    parser.add_argument("--link", type=Path, default=None,
                        help="then point this path (a relative symlink, replaced atomically) at the model's folder: "
                             "the operator's download Job marks a complete cache folder with it")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                        help="then check that the model can be split over N tensor-parallel ranks, as the engine "
                             f"does at start (status {EXIT_PERMANENT} with one line when it cannot)")
    args = parser.parse_args(argv)
    if args.tensor_parallel_size < 1:
        parser.error(f"--tensor-parallel-size must be >= 1, got {args.tensor_parallel_size}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_http_client_logs()
    try:
        folder, name = fetch_model(args.model, interval=args.progress_interval, adapter=args.adapter)
        if args.gguf_dtype and folder.is_file() and folder.suffix.lower() == ".gguf":
            from hetero_infer.worker.runner.loader import convert_gguf  # torch: only here, only for a GGUF

            folder = convert_gguf(folder, dtype=args.gguf_dtype)
        if args.tensor_parallel_size > 1 and not args.adapter and folder.is_dir():
            check_tensor_split(name, folder, args.tensor_parallel_size)
    except ModelSourceError as exc:
        logger.error("%s", exc)
        return EXIT_PERMANENT if exc.permanent else 1
    if args.link is not None:
        link_model(args.link, folder)
    print(folder)
    return 0


def link_model(link: Path, folder: Path) -> None:
    """`link` -> `folder` as a relative symlink (valid wherever the volume holding both is mounted), swapped in
    with a rename so a reader sees the old target or the new one, never none."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(Path(folder).resolve(), link.parent.resolve()), target_is_directory=True)
    os.replace(tmp, link)
