"""Autoscaling mode `operator`: the operator scrapes the workers and sets spec.replicas itself.

- `decision`: the pure decision, (history, observation, policy, now) -> Decision (the HPA's rules);
- `scrape`: which pods serve an InferenceDeployment, and reading their /metrics;
- `loop`: one pass against the API (scrape, decide, write status and spec.replicas) and the task
  that runs a pass every intervalSeconds;
- `metrics`: the operator's own Prometheus metrics.
"""
