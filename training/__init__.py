"""TeamTR: rollouts through the graph, advantages, surrogate + KL trust region, certificate, stage loop."""
