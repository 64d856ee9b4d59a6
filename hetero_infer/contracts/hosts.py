"""DNS rebinding (issue 27): a page on `evil.example` whose name the attacker re-points at 127.0.0.1 makes the
visitor's browser talk to a server on loopback as `Host: evil.example:3000`, `Origin: http://evil.example:3000`:
same-origin to the browser, so neither CORS nor the Origin check stops it. As Jupyter and Vite do, the server
checks the `Host` it is addressed as:

- IP literals are always allowed (a rebinding needs a name), and so are `localhost` and `*.localhost` (names
  that browsers resolve to loopback themselves, RFC 6761).
- `--allowed-hosts NAME` (repeatable) adds names; `.example.com` allows it and its subdomains; `*` any host.
- Without `--allowed-hosts`, names are checked when the server listens on a loopback address and has no API key:
  the one case where a page can reach it through its visitor and nothing else stands in the way. Bound to all
  interfaces (0.0.0.0, a pod IP) it is reached under names nobody lists in advance (Service names, Ingress
  hosts) and answers them all; with API keys a rebinding page has no key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import hdrs, web

from hetero_infer.contracts.errors import APIError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HELP = ("host names this server answers to, besides IP addresses and localhost (repeatable; .example.com for "
        "a domain and its subdomains; * for any). Default: only those when listening on loopback without an API "
        "key (a guard against DNS rebinding), any otherwise")


def check_allowed_hosts(values: list[str]) -> str | None:
    """Why the option is invalid, or None."""
    for v in values:
        if not isinstance(v, str) or not v.strip():
            return "must be non-empty host names"
        if any(c in v for c in "/ @:"):
            return f"{v!r} is not a host name (no scheme, path or port)"
        if "*" in v and v.strip() != "*":  # Starlette's *.example.com would otherwise never match anything
            return f"{v!r}: only * alone is a wildcard; write a domain and its subdomains as .example.com"
    return None


def is_loopback(bind_host: str) -> bool:
    if bind_host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind_host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a `Host` header value, without port and brackets, lower case, no trailing dot."""
    header = header.strip()
    if header.startswith("["):  # [IPv6]:port
        end = header.find("]")
        return header[1:end if end > 0 else None].lower()
    name, sep, port = header.rpartition(":")
    if not sep or not port.isdigit():
        name = header
    return name.lower().rstrip(".")


@dataclass(frozen=True)
class HostPolicy:
    any_host: bool
    names: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()  # ".example.com" entries, with the dot

    @classmethod
    def from_options(cls, allowed_hosts: list[str], bind_host: str, has_api_keys: bool) -> HostPolicy:
        if not allowed_hosts:
            return cls(any_host=has_api_keys or not is_loopback(bind_host))
        entries = [h.strip().lower().rstrip(".") for h in allowed_hosts]
        return cls("*" in entries, frozenset(e for e in entries if not e.startswith(".")),
                   tuple(e for e in entries if e.startswith(".")))

    def allows(self, header: str | None) -> bool:
        if self.any_host or not header:  # no Host at all: HTTP/1.0, never a browser
            return True
        name = host_name(header)
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            pass
        return (name == "localhost" or name.endswith(".localhost") or name in self.names
                or any(name == d[1:] or name.endswith(d) for d in self.domains))


def host_middleware(policy: HostPolicy) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get(hdrs.HOST)
        if not policy.allows(host):
            raise APIError(403, f"host {host!r} is not allowed: this server answers to its IP addresses, localhost "
                           "and the names given with --allowed-hosts (a guard against DNS rebinding)",
                           code="host_not_allowed")
        return await handler(request)

    return middleware
