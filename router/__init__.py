"""The router (`hetero-infer router`): one OpenAI-compatible endpoint in front of a model's workers.

Pure parts, tested without I/O: `hashing` (the block-hash chain shared with the workers' report format),
`index` (which worker holds which blocks), `policies` (prefix, least-load, round-robin). I/O parts: `pool`
(health checks, load scrapes, block reports), `proxy` (retries before the first byte, holding while no worker is
ready), `app` and `cli`.
"""
