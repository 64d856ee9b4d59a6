"""`hetero-infer` command line: serve, generate, bench, operator, router, fetch."""

from __future__ import annotations

import sys

USAGE = """usage: hetero-infer <command> [options]

commands:
  serve      run the OpenAI-compatible worker (HTTP server)
  generate   one-off generation from a prompt
  bench      offline throughput benchmark (`bench serve --url ...` for a serving benchmark)
  operator   run the Kubernetes operator
  router     one OpenAI-compatible endpoint in front of many workers (cache-aware routing)
  fetch      download a model (hf://ORG/NAME, s3://BUCKET/PREFIX) into the caches once

`hetero-infer <command> --help` for a command's options."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from hetero_infer.worker.server.cli import main as run
    elif command == "generate":
        from hetero_infer.worker.generate_cli import main as run
    elif command == "bench":
        if rest and rest[0] == "serve":
            from hetero_infer.bench.serve import main as run

            rest = rest[1:]
        else:
            from hetero_infer.bench.throughput import main as run
    elif command == "operator":
        from hetero_infer.operator.cli import main as run
    elif command == "router":
        from hetero_infer.router.cli import main as run
    elif command == "fetch":
        from hetero_infer.model_source import main as run
    else:
        print(f"hetero-infer: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
