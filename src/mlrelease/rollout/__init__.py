"""The staged value-density rollout: plan, guardrail verdicts and the state machine that drives it."""
