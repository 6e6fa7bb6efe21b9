"""An exactly solvable turn-taking team: a layered (finite-horizon) MDP over finite contexts.

Layer t = 0..T-1 holds K_t contexts; a router names the agent that speaks in each context; the speaker
picks one of M messages; the next context is drawn from P_t(. | context, message); after layer T-1 the
episode ends in a terminal context with reward r in [0, 1]. Rewards arrive only at the end (the
verifier scores the final answer), discounted by gamma per turn.

Every quantity the theorems talk about is a finite sum over this structure, so it is computed exactly
(`exact.py`); nothing is sampled.

Two families:
  random_instance  random transitions, rewards, routers: the property tests' worst-case hunting ground
  chain_instance   the scaling study's team: agents take turns round-robin for R rounds, each turn is
                   one step of a chain; a wrong step breaks the chain for every later turn. Later agents
                   therefore act on contexts produced by earlier agents (the context remembers whether
                   the chain is still intact), which is what makes stale occupancy matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TeamInstance:
    """A layered turn-taking team MDP. Arrays are per layer because K_t may vary."""

    n_agents: int
    n_messages: int
    initial: np.ndarray  # (K_0,) distribution of the first context
    transitions: list[np.ndarray]  # T arrays (K_t, M, K_{t+1}); the last maps into terminal contexts
    router: list[np.ndarray]  # T int arrays (K_t,): which agent speaks in each context
    reward: np.ndarray  # (K_T,) episode-end reward in [0, 1]
    gamma: float = 1.0
    name: str = "team"
    agent_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.agent_names:
            self.agent_names = [f"agent{j}" for j in range(self.n_agents)]
        if len(self.agent_names) != self.n_agents:
            raise ValueError("agent_names must name every agent")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if len(self.transitions) != len(self.router) or not self.transitions:
            raise ValueError("need one transition array and one router array per layer")
        if not np.isclose(self.initial.sum(), 1.0) or (self.initial < 0).any():
            raise ValueError("initial must be a probability distribution")
        sizes = [len(self.initial)] + [P.shape[2] for P in self.transitions]
        for t, (P, route) in enumerate(zip(self.transitions, self.router, strict=True)):
            if P.shape != (sizes[t], self.n_messages, sizes[t + 1]):
                raise ValueError(
                    f"layer {t}: transitions shape {P.shape}, want {(sizes[t], self.n_messages, sizes[t + 1])}"
                )
            if not np.allclose(P.sum(axis=2), 1.0) or (P < 0).any():
                raise ValueError(f"layer {t}: transitions must be distributions over next contexts")
            if route.shape != (sizes[t],) or route.min() < 0 or route.max() >= self.n_agents:
                raise ValueError(f"layer {t}: router must give an agent in [0, {self.n_agents}) per context")
        if self.reward.shape != (sizes[-1],) or self.reward.min() < 0 or self.reward.max() > 1:
            raise ValueError("reward must be one value in [0, 1] per terminal context")

    @property
    def horizon(self) -> int:
        return len(self.transitions)

    @property
    def layer_sizes(self) -> list[int]:
        return [P.shape[0] for P in self.transitions]

    def agent_mask(self, agent: int) -> list[np.ndarray]:
        """Per layer, the contexts where `agent` speaks (its states S_j)."""
        return [route == agent for route in self.router]

    def agent_index(self, role: str) -> int:
        try:
            return self.agent_names.index(role)
        except ValueError:
            raise ValueError(f"unknown role {role!r}; roles are {self.agent_names}") from None


def uniform_logits(instance: TeamInstance) -> list[np.ndarray]:
    return [np.zeros((k, instance.n_messages)) for k in instance.layer_sizes]


def random_logits(instance: TeamInstance, rng: np.random.Generator, scale: float = 1.0) -> list[np.ndarray]:
    return [scale * rng.standard_normal((k, instance.n_messages)) for k in instance.layer_sizes]


def random_instance(
    rng: np.random.Generator,
    n_agents: int = 3,
    n_messages: int = 3,
    contexts: int = 3,
    horizon: int | None = None,
    gamma: float = 1.0,
    round_robin: bool = False,
    concentration: float = 0.5,
) -> TeamInstance:
    """Random transitions (Dirichlet(concentration): small values give near-deterministic contexts),
    random rewards, and a router that is round-robin by layer or random per context."""
    horizon = horizon if horizon is not None else 2 * n_agents
    if horizon < 1 or n_agents < 1 or n_messages < 2 or contexts < 1:
        raise ValueError("need horizon >= 1, n_agents >= 1, n_messages >= 2, contexts >= 1")
    initial = rng.dirichlet(np.full(contexts, concentration))
    transitions = [
        rng.dirichlet(np.full(contexts, concentration), size=(contexts, n_messages)) for _ in range(horizon)
    ]
    if round_robin:
        router = [np.full(contexts, t % n_agents) for t in range(horizon)]
    else:
        router = [rng.integers(0, n_agents, size=contexts) for _ in range(horizon)]
    reward = rng.uniform(0.0, 1.0, size=contexts)
    return TeamInstance(n_agents, n_messages, initial, transitions, router, reward, gamma, name="random")


def chain_instance(
    n_agents: int,
    rng: np.random.Generator,
    rounds: int = 2,
    n_messages: int = 3,
    flavours: int = 2,
    gamma: float = 1.0,
) -> TeamInstance:
    """A chain of T = rounds * n_agents turns, agent t mod n at turn t.

    Context = (intact?, flavour). In an intact context one message (which one depends on the turn and
    flavour, drawn per instance) continues the chain; any other breaks it for good. The flavour of the
    next context is drawn from a per-instance distribution (the "content" of the message so far). The
    final reward is 1 for an intact chain and a per-flavour partial credit in [0, 0.2] otherwise.
    """
    if n_agents < 1 or rounds < 1 or n_messages < 2 or flavours < 1:
        raise ValueError("need n_agents >= 1, rounds >= 1, n_messages >= 2, flavours >= 1")
    horizon = rounds * n_agents
    contexts = 2 * flavours  # index = intact * flavours + flavour; intact=1 means the chain holds
    initial = np.zeros(contexts)
    initial[flavours:] = rng.dirichlet(np.ones(flavours))
    transitions = []
    for _t in range(horizon):
        P = np.zeros((contexts, n_messages, contexts))
        for f in range(flavours):
            next_flavour = rng.dirichlet(np.ones(flavours), size=n_messages)
            correct = rng.integers(n_messages)
            for m in range(n_messages):
                P[f, m, :flavours] = next_flavour[m]  # broken stays broken
                intact = 1 if m == correct else 0
                P[flavours + f, m, intact * flavours : (intact + 1) * flavours] = next_flavour[m]
        transitions.append(P)
    router = [np.full(contexts, t % n_agents) for t in range(horizon)]
    reward = np.concatenate([rng.uniform(0.0, 0.2, size=flavours), np.ones(flavours)])
    return TeamInstance(n_agents, n_messages, initial, transitions, router, reward, gamma, name="chain")


def chain_warm_logits(
    instance: TeamInstance, rng: np.random.Generator, competence: float = 4.0, noise: float = 0.5
) -> list[np.ndarray]:
    """A warm-started team for `chain_instance`: random logits (std `noise`) plus `competence` on the
    message that keeps an intact chain intact (competence 4 with 3 messages: ~96% per step)."""
    logits = random_logits(instance, rng, noise)
    for t, P in enumerate(instance.transitions):
        half = P.shape[2] // 2  # contexts [half:] are the intact ones
        keeps_intact = P[:, :, half:].sum(axis=2) > 0.5  # (K_t, M)
        logits[t] = logits[t] + competence * keeps_intact
    return logits
