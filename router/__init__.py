"""The OpenAI-compatible router: picks a prefill and a decode node per request (scheduling/), runs the
P/D flow against their internal API (pd_flow.py) and answers in OpenAI's shapes (docs/router.md)."""
