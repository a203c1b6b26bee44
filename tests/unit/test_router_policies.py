"""The scheduler's picks for constructed cluster states: exact nodes, no processes."""

from __future__ import annotations

import pytest

from kvferry.router.discovery.nodes import NodeView
from kvferry.router.scheduling import POLICIES, Policy, Scheduler, SchedulingRequest
from kvferry.router.scheduling.scorers import kv_pressure, prefix_hit, queue_depth, transfer_cost


def prefill(name: str, **fields) -> NodeView:
    return NodeView(name=name, url=f"http://{fields.pop('host', '10.0.0.1')}:{8000 + len(name)}/{name}", role="prefill", **fields)


def decode(name: str, **fields) -> NodeView:
    return NodeView(name=name, url=f"http://{fields.pop('host', '10.0.0.1')}:9000/{name}", role="decode", **fields)


def request(num_blocks: int = 4, cached: dict[str, int] | None = None, model: str = "m") -> SchedulingRequest:
    return SchedulingRequest(model=model, num_prompt_tokens=num_blocks * 16 + 3, num_blocks=num_blocks, cached_blocks=cached or {})


def picks(policy: str, nodes: list[NodeView], requests: list[SchedulingRequest]) -> list[tuple[str | None, str]]:
    scheduler = Scheduler(POLICIES[policy])
    decisions = [scheduler.schedule(r, nodes) for r in requests]
    return [(d.prefill.name if d.prefill else None, d.decode.name) for d in decisions]


def test_round_robin_alternates_prefill_and_decode_nodes_in_name_order():
    nodes = [prefill("p1"), prefill("p0"), decode("d0"), decode("d1"), decode("d2")]
    cached = {"p1": 4}  # round robin ignores the index
    assert picks("round_robin", nodes, [request(cached=cached)] * 4) == [
        ("p0", "d0"), ("p1", "d1"), ("p0", "d2"), ("p1", "d0"),
    ]


def test_prefix_policy_sends_a_prompt_to_the_node_holding_its_longest_prefix():
    nodes = [prefill("p0"), prefill("p1"), prefill("p2"), decode("d0")]
    assert picks("prefix", nodes, [request(cached={"p0": 1, "p2": 3})]) == [("p2", "d0")]
    # ... however loaded it is, even for a one-block hit in a hundred; prompts cached nowhere go to the shorter
    # queue, and take turns between equal ones (one turn counter per role).
    loaded = [prefill("p0"), prefill("p1", inflight=9), decode("d0")]
    assert picks("prefix", loaded, [request(cached={"p1": 4}), request(num_blocks=100, cached={"p1": 1}), request()]) == [
        ("p1", "d0"), ("p1", "d0"), ("p0", "d0"),
    ]
    assert picks("prefix", [prefill("p0"), prefill("p1"), decode("d0")], [request()] * 3) == [
        ("p0", "d0"), ("p1", "d0"), ("p0", "d0"),
    ]


def test_least_load_counts_the_routers_inflight_and_the_reported_waiting():
    nodes = [prefill("p0", inflight=2), prefill("p1", inflight=1, waiting=3), prefill("p2", waiting=1),
             decode("d0", inflight=4), decode("d1", inflight=1)]
    assert picks("least_load", nodes, [request(cached={"p0": 4})]) == [("p2", "d1")]


def test_default_policy_prefers_the_cache_hit_over_a_lighter_node():
    nodes = [prefill("p0", inflight=3), prefill("p1"), decode("d0")]
    assert picks("default", nodes, [request(cached={"p0": 4})]) == [("p0", "d0")]
    # With no hit anywhere, load decides.
    assert picks("default", nodes, [request()]) == [("p1", "d0")]
    # A half hit is worth as much as the lighter queue: KV pressure breaks the tie.
    full = [prefill("p0", inflight=3, free_blocks=10, total_blocks=100), prefill("p1", free_blocks=90, total_blocks=100), decode("d0")]
    assert picks("default", full, [request(cached={"p0": 2})]) == [("p1", "d0")]


def test_decode_nodes_are_chosen_by_free_kv_and_load():
    nodes = [prefill("p0"), decode("d0", free_blocks=10, total_blocks=100), decode("d1", free_blocks=80, total_blocks=100),
             decode("d2", free_blocks=90, total_blocks=100, inflight=5)]
    assert picks("default", nodes, [request()]) == [("p0", "d1")]
    # Unknown load (no heartbeat yet) is neutral: better than a full pool, worse than an empty one.
    unknown = [prefill("p0"), decode("d0", free_blocks=5, total_blocks=100), decode("d1"), decode("d2", free_blocks=100, total_blocks=100)]
    assert picks("default", unknown, [request()]) == [("p0", "d2")]


def test_filters_drop_unhealthy_nodes_and_other_models():
    nodes = [prefill("p0", healthy=False), prefill("p1", model="other"), prefill("p2", model="m"),
             decode("d0", model="other"), decode("d1")]
    assert picks("round_robin", nodes, [request(cached={"p0": 4, "p1": 4})] * 2) == [("p2", "d1"), ("p2", "d1")]


def test_colocated_cluster_picks_decode_nodes_with_the_prefill_weights():
    nodes = [decode("d0"), decode("d1"), decode("d2")]
    scheduler = Scheduler(POLICIES["prefix"])
    decision = scheduler.schedule(request(cached={"d2": 4}), nodes)
    assert (decision.prefill, decision.decode.name, decision.colocated, decision.cached_blocks) == (None, "d2", True, 4)


def test_no_healthy_prefill_node_falls_back_to_the_decode_node_and_no_decode_node_raises():
    from kvferry.router.scheduling import NoNodeAvailable

    decision = Scheduler(POLICIES["default"]).schedule(request(), [prefill("p0", healthy=False), decode("d0")])
    assert (decision.prefill, decision.decode.name, decision.colocated) == (None, "d0", False)
    with pytest.raises(NoNodeAvailable, match="decode"):
        Scheduler(POLICIES["default"]).schedule(request(), [prefill("p0"), decode("d0", model="other")])


def test_with_every_decode_node_ejected_they_are_all_tried_anyway():
    nodes = [prefill("p0"), decode("d0", healthy=False), decode("d1", healthy=False, model="other"),
             decode("d2", healthy=False)]
    assert picks("round_robin", nodes, [request()] * 3) == [("p0", "d0"), ("p0", "d2"), ("p0", "d0")]
    # One healthy decode node is enough to leave the ejected ones alone.
    assert picks("round_robin", [*nodes, decode("d3")], [request()] * 2) == [("p0", "d3"), ("p0", "d3")]


def test_transfer_cost_prefers_a_prefill_node_on_the_decode_nodes_host():
    nodes = [prefill("p0", host="10.0.0.2"), prefill("p1", host="10.0.0.3"), decode("d0", host="10.0.0.3")]
    policy = Policy("local", prefill={"transfer_cost": 1.0}, decode={})
    assert Scheduler(policy).schedule(request(), nodes).prefill.name == "p1"


def test_scorers_stay_within_zero_and_one():
    nodes = [prefill("p0", inflight=7, free_blocks=0, total_blocks=8), prefill("p1", waiting=2), prefill("p2", free_blocks=8, total_blocks=8)]
    req = request(num_blocks=2, cached={"p0": 5, "p1": 1})
    assert prefix_hit(req, nodes) == [1.0, 0.5, 0.0]
    assert queue_depth(req, nodes) == [0.0, 5 / 7, 1.0]
    assert kv_pressure(req, nodes) == [0.0, 0.5, 1.0]
    assert transfer_cost(req, nodes) == [1.0, 0.5, 0.0]  # no decode node chosen yet: the share already held
    assert prefix_hit(request(num_blocks=0, cached={"p0": 1}), nodes) == [0.0, 0.0, 0.0]


def test_policies_refuse_unknown_scorers_and_negative_weights():
    with pytest.raises(ValueError, match="unknown scorers"):
        Policy("bad", prefill={"nope": 1.0})
    with pytest.raises(ValueError, match=">= 0"):
        Policy("bad", decode={"queue_depth": -1.0})


def test_a_conversation_stays_on_its_last_turns_nodes_until_they_are_overloaded():
    """The decode node of the last turn holds the answer's KV: it keeps the conversation over a lighter node,
    not over one whose queue is SESSION_QUEUE_SLACK shorter or when its KV pool is nearly full."""
    from dataclasses import replace

    from kvferry.router.scheduling.scorers import SESSION_QUEUE_SLACK

    session = replace(request(cached={"p0": 4, "p1": 4}), session_nodes=frozenset({"p1", "d1"}))
    lighter = [prefill("p0"), prefill("p1", inflight=1), decode("d0", inflight=1), decode("d1", inflight=2, free_blocks=50,
                                                                                          total_blocks=100)]
    assert picks("session", lighter, [session]) == [("p1", "d1")]
    assert picks("session", lighter, [request(cached={"p0": 4, "p1": 4})]) == [("p0", "d0")]  # no session: by load
    assert picks("default", lighter, [session]) == [("p0", "d0")]  # the default policy has no session scorer
    queued = [*lighter[:2], decode("d0"), decode("d1", inflight=SESSION_QUEUE_SLACK + 1)]
    assert picks("session", queued, [session]) == [("p1", "d0")]
    full = [*lighter[:2], decode("d0", inflight=1), decode("d1", inflight=1, free_blocks=4, total_blocks=100)]
    assert picks("session", full, [session]) == [("p1", "d0")]


def test_sessions_are_forgotten_after_their_ttl_and_beyond_the_limit():
    from kvferry.router.scheduling.sessions import SessionAffinity

    now = [0.0]
    sessions = SessionAffinity(ttl_seconds=10, max_sessions=2, clock=lambda: now[0])
    sessions.record("a", frozenset({"p0", "d0"}))
    now[0] = 5
    sessions.record("b", frozenset({"p1"}))
    assert sessions.nodes("a") == {"p0", "d0"} and sessions.nodes(None) == frozenset()
    now[0] = 11
    assert sessions.nodes("a") == frozenset() and sessions.nodes("b") == {"p1"}
    sessions.record("c", frozenset({"d1"}))
    sessions.record("d", frozenset({"d0"}))
    assert sessions.nodes("b") == frozenset() and sessions.nodes("d") == {"d0"}  # the oldest went first


OLD, NEW = '["m", "old-weights"]', '["m", "new-weights"]'  # two checkpoints' KV identities


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_prefill_node_is_paired_only_with_a_decode_node_that_takes_its_kv(policy: str):
    # Mid-rollout: the new prefill node is up, the new decode node too, the old ones not yet gone.
    nodes = [prefill("p-new", kv_identity=NEW), prefill("p-old", kv_identity=OLD, inflight=5),
             decode("d-old", kv_identity=OLD), decode("d-new", kv_identity=NEW, inflight=5)]
    for pair in picks(policy, nodes, [request(cached={"p-new": 4}), request(cached={"p-old": 4}), request()] * 2):
        assert pair in {("p-new", "d-new"), ("p-old", "d-old")}, pair


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_decode_node_with_a_prefill_node_for_it_comes_first_and_one_without_prefills_itself(policy: str):
    # The new prefill node is up, the new decode node not yet: the old decode node has no partner left.
    rolling = [prefill("p-new", kv_identity=NEW), decode("d-old", kv_identity=OLD)]
    assert picks(policy, rolling, [request()]) == [(None, "d-old")]
    both = [*rolling, decode("d-new", kv_identity=NEW, inflight=9)]
    assert picks(policy, both, [request(), request()]) == [("p-new", "d-new")] * 2


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_node_whose_record_the_router_has_not_read_pairs_only_with_another_such_node(policy: str):
    # Mid-rollout, a new pod is Ready (discovery lists it) a moment before the router reads its record: its
    # model is unknown, as likely the new one as the old (a CI run saw such a pair refused by the transfer).
    unread_prefill = [prefill("p-new"), prefill("p-old", kv_identity=OLD, inflight=9), decode("d-old", kv_identity=OLD)]
    assert set(picks(policy, unread_prefill, [request(cached={"p-new": 4})] * 3)) == {("p-old", "d-old")}
    unread_decode = [prefill("p-old", kv_identity=OLD), decode("d-new"), decode("d-old", kv_identity=OLD, inflight=9)]
    assert set(picks(policy, unread_decode, [request()] * 3)) <= {("p-old", "d-old"), (None, "d-new")}
    # Without a registry no node's identity is known: they all pair.
    assert picks(policy, [prefill("p0"), decode("d0")], [request()]) == [("p0", "d0")]
