"""The escape hatch of an InferenceDeployment (pure): what the CRD does not model, given anyway and checked as far as
the operator can: extra `hetero-infer serve` flags, JSON patches of the worker pod template, /dev/shm's size, probe
timings, and security contexts that still meet the "restricted" Pod Security Standard.

Every one is rendered only when given (manifests/worker.py), so a spec without them renders the pods as before.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.options import add_flags, options_of
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.operator.spec_reader import Reader, type_name

DEFAULT_SHM_SIZE = "1Gi"  # per GPU, at least one (shm_size)
MAX_EXTRA_ARGS = 64
# The flags the operator renders from the spec itself (manifests/worker.py: worker_args), by the field that sets them.
RENDERED_FLAGS = {"host": "all addresses, in a pod", "port": "the pod's named port", "served_model_name": "spec.model.name",
                  "executor": "spec.executor", "device": "spec.resources.gpus", "shutdown_grace": "spec.drainSeconds",
                  "model": "spec.model", "tensor_parallel_size": "spec.resources.gpus"}


@dataclass(frozen=True)
class ProbeTuning:
    period_seconds: int
    timeout_seconds: int
    failure_threshold: int


DEFAULT_LIVENESS = ProbeTuning(10, 3, 3)  # a dead engine: restarted about 30-40 s after it died
DEFAULT_READINESS = ProbeTuning(5, 3, 2)


@dataclass(frozen=True)
class OverridesSpec:
    extra_args: tuple[str, ...] = ()
    json_patches: tuple[dict[str, Any], ...] = ()
    shm_size: str | None = None  # None: DEFAULT_SHM_SIZE per GPU (shm_size)
    liveness: ProbeTuning = DEFAULT_LIVENESS
    readiness: ProbeTuning = DEFAULT_READINESS
    pod_security_context: dict[str, Any] | None = None
    security_context: dict[str, Any] | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # never exit: the message becomes a spec problem
        raise ValueError(message)


def _serve_parser() -> _Parser:
    parser = _Parser(prog="hetero-infer serve", add_help=False, allow_abbrev=False)
    add_flags(parser, ServerOptions)
    add_flags(parser, EngineConfig)
    return parser


def parse_extra_args(r: Reader, raw: Any, path: str, engine_keys: tuple[str, ...]) -> tuple[str, ...]:
    """spec.engine.extraArgs: `hetero-infer serve` flags the CRD does not model, checked by the worker's own option
    definitions (an unknown flag or a bad value is a spec problem, not a crash-looping pod); not the ones the
    operator renders itself (`engine_keys`: spec.engine's, in snake_case) and not secrets (those come from Secrets)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        r.bad(path, f"must be an array of strings, got {type_name(raw)}")
        return ()
    if len(raw) > MAX_EXTRA_ARGS:
        r.bad(path, f"must have at most {MAX_EXTRA_ARGS} items, got {len(raw)}")
        return ()
    try:
        parsed = vars(_serve_parser().parse_args(raw))
    except ValueError as e:
        r.bad(path, f"hetero-infer serve would refuse them: {e}")
        return ()
    options = {**options_of(ServerOptions), **options_of(EngineConfig)}
    for name, value in parsed.items():
        if value is None:
            continue
        flag = options[name].flag
        if name in RENDERED_FLAGS:
            r.bad(path, f"{flag} is set by the operator ({RENDERED_FLAGS[name]})")
        elif name in engine_keys:
            r.bad(path, f"{flag} is spec.engine's field; set it there")
        elif options[name].secret:
            r.bad(path, f"{flag} is a secret: give it with spec.apiKey (a Secret), never on a command line")
    return tuple(raw)


def parse_overrides(r: Reader, spec: Mapping[str, Any], extra_args: tuple[str, ...]) -> OverridesSpec:
    p = "spec"
    probes = r.obj(spec.get("probes"), f"{p}.probes", r.keys(f"{p}.probes"))
    return OverridesSpec(
        extra_args=extra_args,
        json_patches=_json_patches(r, spec.get("jsonPatches"), f"{p}.jsonPatches"),
        shm_size=r.quantity(spec, "shmSize", p),
        liveness=_probe(r, probes.get("liveness"), f"{p}.probes.liveness", DEFAULT_LIVENESS),
        readiness=_probe(r, probes.get("readiness"), f"{p}.probes.readiness", DEFAULT_READINESS),
        pod_security_context=_security(r, spec.get("podSecurityContext"), f"{p}.podSecurityContext", pod=True),
        security_context=_security(r, spec.get("securityContext"), f"{p}.securityContext", pod=False),
    )


def _probe(r: Reader, raw: Any, path: str, default: ProbeTuning) -> ProbeTuning:
    pr = r.obj(raw, path, r.keys(path))
    tuning = ProbeTuning(*(r.field(pr, key, path) or getattr(default, attr) for key, attr in (
        ("periodSeconds", "period_seconds"), ("timeoutSeconds", "timeout_seconds"),
        ("failureThreshold", "failure_threshold"))))
    if tuning.timeout_seconds > tuning.period_seconds:
        r.bad(path, f"timeoutSeconds ({tuning.timeout_seconds}) must not exceed periodSeconds "
                    f"({tuning.period_seconds})")
    return tuning


def _json_patches(r: Reader, raw: Any, path: str) -> tuple[dict[str, Any], ...]:
    """RFC 6902 operations on the worker pod template ({metadata, spec}); applied after rendering
    (manifests/worker.py), where one that does not apply is a spec problem too."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.bad(path, f"must be an array, got {type_name(raw)}")
        return ()
    out = []
    for i, item in enumerate(raw):
        q = f"{path}[{i}]"
        op = r.obj(item, q, r.keys(q), required=("op", "path"))
        kind = r.field(op, "op", q)
        target = op.get("path")
        if not isinstance(target, str) or not (target == "" or target.startswith("/")):
            r.bad(f"{q}.path", f"must be a JSON pointer such as /spec/containers/0/args/-, got {target!r}")
        if kind in ("add", "replace", "test") and "value" not in op:
            r.bad(f"{q}.value", f"is required for op {kind}")
        if kind in ("move", "copy") and not isinstance(op.get("from"), str):
            r.bad(f"{q}.from", f"is required for op {kind}")
        out.append(dict(op))
    return tuple(out)


# The "restricted" Pod Security Standard (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
# what a given security context may not say. Unset fields are filled with the operator's restricted defaults.
SECCOMP_TYPES = ("RuntimeDefault", "Localhost")


def _security(r: Reader, raw: Any, path: str, pod: bool) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        r.bad(path, f"must be an object, got {type_name(raw)}")
        return None
    sc = dict(raw)
    if sc.get("runAsNonRoot") is False:
        r.bad(f"{path}.runAsNonRoot", "must not be false (the restricted Pod Security Standard)")
    if sc.get("runAsUser") == 0:
        r.bad(f"{path}.runAsUser", "must not be 0 (root; the restricted Pod Security Standard)")
    seccomp = sc.get("seccompProfile")
    if seccomp is not None and (not isinstance(seccomp, Mapping) or seccomp.get("type") not in SECCOMP_TYPES):
        r.bad(f"{path}.seccompProfile.type", f"must be one of {', '.join(SECCOMP_TYPES)} (restricted)")
    if not pod:
        if sc.get("privileged") is True:
            r.bad(f"{path}.privileged", "must not be true (restricted)")
        if sc.get("allowPrivilegeEscalation") is True:
            r.bad(f"{path}.allowPrivilegeEscalation", "must not be true (restricted)")
        caps = sc.get("capabilities") or {}
        added = set((caps.get("add") or []) if isinstance(caps, Mapping) else []) - {"NET_BIND_SERVICE"}
        if added:
            r.bad(f"{path}.capabilities.add", f"may add only NET_BIND_SERVICE (restricted), got {sorted(added)}")
        if isinstance(caps, Mapping) and "drop" in caps and "ALL" not in (caps.get("drop") or []):
            r.bad(f"{path}.capabilities.drop", "must include ALL (restricted)")
    return sc


def shm_size(overrides: OverridesSpec, gpus: int) -> str:
    """The worker's /dev/shm: spec.shmSize, else 1Gi per GPU (the tensor-parallel ranks' NCCL buffers), at least 1Gi."""
    if overrides.shm_size:
        return overrides.shm_size
    return f"{max(1, gpus) * int(DEFAULT_SHM_SIZE.removesuffix('Gi'))}Gi"
