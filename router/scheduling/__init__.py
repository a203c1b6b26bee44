"""llm-d's scheduler shape: filters drop nodes, scorers rate the rest in [0, 1], weights combine the
scores, and one picker chooses. Policies are named sets of weights (policies.py)."""

from kvferry.router.scheduling.policies import POLICIES, Policy, ScorerWeights
from kvferry.router.scheduling.scheduler import Decision, NoNodeAvailable, Scheduler, SchedulingRequest

__all__ = ["POLICIES", "Decision", "NoNodeAvailable", "Policy", "Scheduler", "SchedulingRequest", "ScorerWeights"]
