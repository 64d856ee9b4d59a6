"""spec.service.ingress and spec.service.httpRoute: an Ingress or a Gateway API HTTPRoute to the Service users call
(the router's with spec.router, else the workers'), created with the spec and deleted when the spec drops it."""

from __future__ import annotations

import kubernetes_validate
import pytest
from test_operator_reconcile import FakeClient, infd, run

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import strip_none
from hetero_infer.operator.manifests import Owner, children
from hetero_infer.operator.spec import SpecError, parse_spec

OWNER = Owner("smol", "ns", "uid-1")
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
INGRESS = {"className": "nginx", "host": "llm.example.com", "path": "/v1",
           "annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"}, "tlsSecretName": "llm-tls"}
ROUTE = {"parentRefs": [{"name": "internal", "namespace": "gateways", "sectionName": "https"}],
         "hostnames": ["llm.internal.example.com"]}


def spec(**service):
    return parse_spec({"model": {"name": "smol", "path": "/m"}, "router": {"enabled": True},
                       "service": {"port": 8080, **service}}, "smol")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_ingress_routes_to_the_service_users_call(version: str) -> None:
    kids = children(OWNER, spec(ingress=INGRESS))
    ing = kids.ingress
    assert ing is not None and kids.http_route is None
    kubernetes_validate.validate(strip_none(ing), version, strict=True)
    assert ing["metadata"]["name"] == kids.service["metadata"]["name"] == "smol"
    assert ing["spec"]["ingressClassName"] == "nginx"
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    (path,) = rule["http"]["paths"]
    assert path == {"path": "/v1", "pathType": "Prefix",
                    "backend": {"service": {"name": "smol", "port": {"number": 8080}}}}
    assert ing["spec"]["tls"] == [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    assert c.OPTIONAL_INGRESS in kids.service["metadata"]["annotations"][c.OPTIONAL_CHILDREN_ANNOTATION]


def test_the_http_route_attaches_to_the_gateways_given() -> None:
    """Gateway API v1 HTTPRoute fields (its schema is not bundled offline: the fields are checked one by one)."""
    kids = children(OWNER, spec(httpRoute=ROUTE))
    route = kids.http_route
    assert route is not None and kids.ingress is None
    assert (route["apiVersion"], route["kind"]) == ("gateway.networking.k8s.io/v1", "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"name": "internal", "namespace": "gateways", "sectionName": "https"}]
    assert route["spec"]["hostnames"] == ["llm.internal.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["backendRefs"] == [{"name": "smol", "port": 8080}]


@pytest.mark.parametrize("service, problem", [
    ({"httpRoute": {"hostnames": ["a.example.com"]}}, "spec.service.httpRoute.parentRefs"),
    ({"httpRoute": {"parentRefs": []}}, "spec.service.httpRoute.parentRefs"),
    ({"httpRoute": {"parentRefs": [{"namespace": "gw"}]}}, "spec.service.httpRoute.parentRefs[0].name"),
    ({"ingress": {"path": "v1"}}, "spec.service.ingress.path"),
    ({"ingress": {"host": "Not A Host"}}, "spec.service.ingress.host"),
    ({"ingress": {"tls": "x"}}, "spec.service.ingress.tls"),
])
def test_a_bad_exposure_is_refused_with_its_path(service: dict, problem: str) -> None:
    with pytest.raises(SpecError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        spec(**service)


def test_adding_and_dropping_them_creates_and_deletes_them() -> None:
    client = FakeClient()
    body = infd(client, service={"ingress": INGRESS, "httpRoute": ROUTE})
    run(client)
    assert ("Ingress", "ns", "smol") in client.objects and ("HTTPRoute", "ns", "smol") in client.objects
    body["spec"]["service"] = {"httpRoute": ROUTE}
    body["metadata"]["generation"] = 2
    run(client)
    assert ("Ingress", "ns", "smol") not in client.objects and ("HTTPRoute", "ns", "smol") in client.objects
    body["spec"]["service"] = {}
    body["metadata"]["generation"] = 3
    run(client)
    assert ("HTTPRoute", "ns", "smol") not in client.objects
    client.writes.clear()
    run(client)
    assert client.writes == []  # converged
