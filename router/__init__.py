"""The OpenAI-compatible router, by stage (docs/design.md):

- api/: OpenAI's request and response shapes, tokenization and limits, SSE, errors;
- admission/: API keys, the in-flight limit, request plugins;
- scheduling/: prefix lookup, the P/D decision, filters -> scorers -> picker;
- dispatch/: the P/D flow of each scheduled choice, two calls, one to each node;
- discovery/: where the nodes are, their records and health, as the scheduler's snapshots;
- metrics.py: Prometheus and /stats.

service.py runs one request through the stages; app.py wires them into the FastAPI app.
"""
