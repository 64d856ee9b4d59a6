"""The router's load scrape reads only three gauges' lines of a worker's /metrics: checked against the
exposition prometheus_client writes and its own parser, with other families (histograms, counters) around."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hetero_infer.router.pool import LOAD_METRICS, parse_load

values = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(LOAD_METRICS)), st.lists(values, min_size=1, max_size=3)), values)
def test_parse_load_agrees_with_the_prometheus_parser(gauges, other):
    r = CollectorRegistry()
    h = Histogram("hetero_infer_time_to_first_token_seconds", "ttft", ["model_name"], registry=r)
    h.labels("m").observe(other)
    Counter("hetero_infer_num_requests_running_max", "a look-alike name", registry=r).inc(other)
    Gauge("hetero_infer_num_requests_waiting_by_priority", "another look-alike", registry=r).set(other)
    for name, per_model in gauges.items():
        g = Gauge(name, "load", ["model_name"], registry=r)
        for i, v in enumerate(per_model):
            g.labels(f"model-{i}").set(v)
    text = generate_latest(r).decode()
    expected: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = LOAD_METRICS.get(sample.name)
            if key is not None:
                expected[key] = expected.get(key, 0.0) + sample.value
    assert parse_load(text) == expected
