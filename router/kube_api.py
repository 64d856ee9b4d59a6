"""The router's way to the Kubernetes API server (EndpointSlice discovery, scale from zero).

In a pod: the service account's token, read anew for every request (the kubelet rotates it), and its CA;
elsewhere the kubeconfig ($KUBECONFIG or ~/.kube/config, through the `kubernetes` package).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class ApiAccess:
    """Where the API server is and how to authenticate, re-read per request (rotated tokens)."""

    host: str
    authorization: Callable[[], str | None]
    ssl: ssl.SSLContext | bool | None = None

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "hetero-infer-router"}
        token = self.authorization()
        if token:
            headers["Authorization"] = token
        return headers


def in_cluster_namespace() -> str | None:
    try:
        with open(os.path.join(SERVICE_ACCOUNT_DIR, "namespace")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def api_access() -> ApiAccess:
    """In a pod: the service account; elsewhere the kubeconfig (needs the `kubernetes` package)."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token_path = os.path.join(SERVICE_ACCOUNT_DIR, "token")
    if host and os.path.exists(token_path):
        def bearer() -> str:
            with open(token_path) as f:
                return "Bearer " + f.read().strip()

        context = ssl.create_default_context(cafile=os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt"))
        server = f"[{host}]" if ":" in host else host
        return ApiAccess(f"https://{server}:{port}", bearer, context)
    from hetero_infer.contracts import kube

    cfg = kube.load_configuration()
    context: ssl.SSLContext | bool | None = None
    if cfg.host.startswith("https"):
        if not cfg.verify_ssl:
            context = False
        else:
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ApiAccess(cfg.host.rstrip("/"), lambda: kube.authorization_header(cfg), context)

