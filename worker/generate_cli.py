"""`hetero-infer generate`: one-off generation from a prompt (or a chat message)."""

from __future__ import annotations

import argparse
import sys

from hetero_infer.model_source import ModelSourceError
from hetero_infer.worker.cli_args import add_engine_args, engine_config_from_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetero-infer generate", description=__doc__)
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text to continue")
    prompt.add_argument("--prompt-token-ids", type=_token_ids, metavar="ID,ID,...",
                        help="token ids to continue (prints the output token ids; the way to prompt a model run "
                             "with --skip-tokenizer-init)")
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
    from hetero_infer.contracts.sampling_params import SamplingParams
    from hetero_infer.worker.frontend.llm import LLM

    try:
        config = engine_config_from_args(args)
        params = SamplingParams(
            n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            max_tokens=args.max_tokens,
        )
        llm = LLM(**config.to_dict(), engine_process=False)  # one prompt: a second process only adds start-up
        if args.prompt_token_ids is not None:
            if args.chat:
                raise ValueError("--chat needs a text --prompt")
            outputs = llm.generate(prompt_token_ids=args.prompt_token_ids, sampling_params=params)
        elif args.chat:
            outputs = llm.chat([{"role": "user", "content": args.prompt}], params)
        else:
            outputs = llm.generate(args.prompt, params)
    except (ValueError, FileNotFoundError, ModelSourceError) as exc:
        print(f"hetero-infer generate: error: {exc}", file=sys.stderr)
        return 2
    for completion in outputs[0].outputs:
        if args.prompt_token_ids is not None:
            print(",".join(map(str, completion.token_ids)))
        else:
            print(("" if args.chat else args.prompt) + completion.text)
    return 0


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids") from None
    if not ids:
        raise argparse.ArgumentTypeError("no token ids given")
    return ids
