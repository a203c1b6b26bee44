"""The node runtime that prefill and decode nodes share: settings, engine and transfer start-up, the
load reporter, metrics, the common routes and the NDJSON token stream. What differs between the roles
(their side of the KV connector and their routes) lives in prefill_node/ and decode_node/."""
