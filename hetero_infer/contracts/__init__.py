"""What the three programs (the worker, the router, the operator) agree on, importable by each without the
others: the OpenAI protocol and its error shape, API keys, CORS, the options of every command and their loader, the
prefix-cache block hashes, the chat prompt and the tokenizer wrapper. docs/contracts.md describes them.

Nothing here imports the worker, the kernels or torch (tests/test_imports.py checks it); `tokenizer` loads
transformers, which imports torch where torch is installed (never in the operator image, which the router
runs from).
"""
