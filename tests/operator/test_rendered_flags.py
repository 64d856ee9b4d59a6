"""The command lines the operator renders are read back by the real commands' parsers as the spec's values: one
definition of each option (hetero_infer.contracts), not a hand-kept list of flags in the operator."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.options import add_flags, load_options, to_flags
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import SHUTDOWN_GRACE_SECONDS, Owner, router_args, worker_args
from hetero_infer.operator.spec import EngineSpec, parse_spec

OWNER = Owner("smol", "models", "uid-1")

engine_specs = st.fixed_dictionaries({}, optional={
    "blockSize": st.integers(1, 256),
    "maxNumSeqs": st.integers(1, 4096),
    "maxModelLen": st.integers(1, 1 << 20),
    "maxNumBatchedTokens": st.integers(1, 1 << 16),
    "dtype": st.sampled_from(["auto", "float32", "float16", "bfloat16"]),
    "quantization": st.sampled_from(["int8", "int4"]),
    "memoryThreshold": st.floats(0.001, 1.0),
    "gpuMemoryUtilization": st.floats(0.001, 1.0),
    "kvOffloadingSize": st.floats(0.001, 64.0),
})


@settings(max_examples=25, deadline=None)
@given(engine=engine_specs, gpus=st.sampled_from([0, 1, 2, 8]), executor=st.sampled_from(["torch", "mock"]))
def test_the_worker_command_line_reads_back_as_the_spec(engine: dict, gpus: int, executor: str) -> None:
    from hetero_infer.worker.server.cli import build_parser, resolve_options

    if gpus > 1:
        executor = "torch"  # the mock runs no model to split (refused: test_tensor_parallel_spec.py)

    spec = parse_spec({"model": {"name": "smol", "path": "/models/smol"}, "executor": executor,
                       "resources": {"gpus": gpus}, "engine": engine}, "smol")
    args = worker_args(spec)
    assert args[0] == "serve"
    server, config = resolve_options(build_parser().parse_args(args[1:]), environ={})
    assert (server.host, server.port, server.shutdown_grace) == ("0.0.0.0", c.WORKER_PORT, SHUTDOWN_GRACE_SECONDS)
    assert (config.model, config.served_model_name, config.executor) == ("/models/smol", "smol", executor)
    assert config.device == ("cuda" if gpus else "cpu")
    assert config.tensor_parallel_size == max(1, gpus)
    for name, value in dataclasses.asdict(spec.engine).items():
        assert getattr(config, name) == (value if value is not None else getattr(EngineConfig(), name)), name


cors_lists = st.lists(st.sampled_from(["GET", "POST", "PUT", "*"]), min_size=1, max_size=3)


@settings(max_examples=25, deadline=None)
@given(origins=st.lists(st.sampled_from(["https://a.example", "http://b.example:8080"]), max_size=2),
       methods=cors_lists, credentials=st.booleans(), tokenizer=st.sampled_from(["workers", "none"]),
       block_size=st.none() | st.integers(1, 256), hold=st.integers(1, 3600),
       policy=st.sampled_from(["prefix", "least-load", "round-robin"]))
def test_the_router_command_line_reads_back_as_the_spec(origins: list, methods: list, credentials: bool,
                                                        tokenizer: str, block_size: int | None, hold: int,
                                                        policy: str) -> None:
    from hetero_infer.router.cli import resolve_options

    engine = {} if block_size is None else {"blockSize": block_size}
    spec = parse_spec({"model": {"name": "smol"}, "engine": engine, "router": {
        "enabled": True, "policy": policy, "holdTimeoutSeconds": hold, "tokenizer": tokenizer,
        "cors": {"allowedOrigins": origins, "allowedMethods": methods, "allowCredentials": credentials}}}, "smol")
    args = router_args(OWNER, spec)
    assert args[0] == "router"
    options = resolve_options(args[1:], environ={})
    assert (options.host, options.port, options.policy) == ("0.0.0.0", c.WORKER_PORT, policy)
    assert (options.discover_service, options.namespace) == ("smol-workers", "models")
    assert (options.hold_timeout_s, options.tokenizer) == (hold, tokenizer)
    assert options.block_size == (block_size or RouterOptions().block_size)
    assert (options.allowed_origins, options.allowed_methods) == (origins, methods)
    assert options.allow_credentials == credentials


def test_options_at_the_routers_defaults_render_no_flag() -> None:
    """A spec that writes out the defaults (as the API server fills them in) renders what a spec without them
    does, so adding a field never rolls the routers."""
    bare = parse_spec({"model": {"name": "smol"}, "router": {"enabled": True}}, "smol")
    spelled = parse_spec({"model": {"name": "smol"}, "router": {
        "enabled": True, "tokenizer": "workers",
        "cors": {"allowedOrigins": [], "allowedMethods": ["*"], "allowedHeaders": ["*"],
                 "allowCredentials": False}}}, "smol")
    assert router_args(OWNER, bare) == router_args(OWNER, spelled)
    assert not any(a.startswith(("--allowed", "--allow-", "--tokenizer")) for a in router_args(OWNER, bare))


def test_every_engine_field_of_the_spec_is_an_engine_option() -> None:
    options = {f.name for f in dataclasses.fields(EngineConfig)}
    assert {f.name for f in dataclasses.fields(EngineSpec)} <= options


# -- to_flags itself --------------------------------------------------------------------------------------
@dataclass
class Opts:
    name: str = "x"
    count: int = 1
    ratio: float = 0.5
    on: bool = False
    tags: list[str] = field(default_factory=list)
    limit: int | None = None
    key: str | None = field(default=None, repr=False)


def _read_back(args: list[str]) -> Opts:
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser, Opts)
    (opts,) = load_options((Opts,), parser.parse_args(args), "T_", environ={})
    return opts


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "name": st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1),
    "count": st.integers(-10**9, 10**9),
    "ratio": st.floats(allow_nan=False, allow_infinity=False),
    "on": st.booleans(),
    "tags": st.lists(st.sampled_from(["a", "b c", "d=e", "-f", "--g"]), max_size=3),
    "limit": st.none() | st.integers(0, 100),
}))
def test_to_flags_reads_back_as_the_same_values(values: dict) -> None:
    opts = _read_back(to_flags(Opts, values))
    for name, value in values.items():
        assert getattr(opts, name) == (getattr(Opts(), name) if value is None else value), name


def test_floats_render_short_where_that_is_exact() -> None:
    assert to_flags(Opts, {"ratio": 45.0}) == ["--ratio", "45"]
    assert to_flags(Opts, {"ratio": 0.85}) == ["--ratio", "0.85"]
    assert to_flags(Opts, {"ratio": 0.1234567891}) == ["--ratio", "0.1234567891"]  # :g alone would round it
    assert to_flags(Opts, {"ratio": -1e-05, "tags": ["-a", "b"]}) == ["--ratio=-1e-05", "--tags=-a", "--tags", "b"]


def test_to_flags_refuses_unknown_options_wrong_types_and_secrets() -> None:
    with pytest.raises(KeyError, match="no option 'cuont'"):
        to_flags(Opts, {"cuont": 3})
    with pytest.raises(ValueError, match="count=.* must be an integer"):
        to_flags(Opts, {"count": "3"})
    with pytest.raises(ValueError, match="secret"):
        to_flags(Opts, {"key": "sk-123"})
    with pytest.raises(ValueError, match="secret"):
        to_flags(ServerOptions, {"api_key": ["sk-123"]})


def test_the_crds_choices_are_the_options_choices(crd: dict) -> None:
    """The CRD (the third copy of the contract) offers exactly what the commands accept."""
    import typing

    from hetero_infer.contracts.engine_options import DTYPES, EXECUTORS, Quantization

    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["executor"]["enum"] == list(EXECUTORS)
    assert spec["engine"]["properties"]["dtype"]["enum"] == list(DTYPES)
    assert spec["engine"]["properties"]["quantization"]["enum"] == list(typing.get_args(Quantization))
    policies = typing.get_args(typing.get_type_hints(RouterOptions)["policy"])
    assert spec["router"]["properties"]["policy"]["enum"] == list(policies)
    assert spec["router"]["properties"]["policy"]["default"] == RouterOptions().policy
    assert spec["router"]["properties"]["tokenizer"]["default"] == RouterOptions().tokenizer
    cors = spec["router"]["properties"]["cors"]["properties"]
    assert cors["allowedMethods"]["default"] == RouterOptions().allowed_methods
    assert cors["allowedHeaders"]["default"] == RouterOptions().allowed_headers
