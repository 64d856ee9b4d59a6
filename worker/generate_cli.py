"""`hetero-infer generate`: one-off generation from a prompt (or a chat message)."""

from __future__ import annotations

import argparse
import sys

from hetero_infer.model_source import ModelSourceError
from hetero_infer.worker.cli_args import add_engine_args, engine_config_from_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetero-infer generate", description=__doc__)
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user message (chat template)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--n", type=int, default=1)
    add_engine_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from hetero_infer.worker.core.sampling_params import SamplingParams
    from hetero_infer.worker.frontend.llm import LLM

    try:
        config = engine_config_from_args(args)
        params = SamplingParams(
            n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            max_tokens=args.max_tokens,
        )
        llm = LLM(**config.to_dict())
        if args.chat:
            outputs = llm.chat([{"role": "user", "content": args.prompt}], params)
        else:
            outputs = llm.generate(args.prompt, params)
    except (ValueError, FileNotFoundError, ModelSourceError) as exc:
        print(f"hetero-infer generate: error: {exc}", file=sys.stderr)
        return 2
    for completion in outputs[0].outputs:
        prefix = "" if args.chat else args.prompt
        print(prefix + completion.text)
    return 0
