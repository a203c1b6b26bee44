"""The autoscaling planner: a role's metrics over the last interval in, its replica count out.

Pure (no clock, no Kubernetes, no HTTP): the operator scrapes the metrics, calls `plan` once an interval
per role with the state the last call returned, and applies the decision. Replayed on recorded or
simulated traces, the same calls make the same decisions, which is how it is tested (tests/unit).
"""
