"""Puts this folder on sys.path (pytest's default import mode adds a conftest's folder): the test folders share
`cli_process.py` (tests/server/server_proc.py and tests/router/router_proc.py build on it)."""
