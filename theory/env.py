"""An exactly solvable turn-taking team: a layered (finite-horizon) MDP over finite contexts.

Layer t = 0..T-1 holds K_t contexts; a router names the agent that speaks in each context; the speaker
picks one of M messages; the next context is drawn from P_t(. | context, message); after layer T-1 the
episode ends in a terminal context with reward r in [0, 1]. Rewards arrive only at the end (the
verifier scores the final answer), discounted by gamma per turn.

Every quantity the theorems talk about is a finite sum over this structure, so it is computed exactly
(`exact.py`); nothing is sampled.

Three families:
  random_instance  random transitions, rewards, routers: the property tests' worst-case hunting ground
  chain_instance   the scaling study's team: agents take turns round-robin for R rounds, each turn is
                   one step of a chain; a wrong step breaks the chain for every later turn. Later agents
                   therefore act on contexts produced by earlier agents (the context remembers whether
                   the chain is still intact), which is what makes stale occupancy matter.
  convention_instance  the same turn-taking, but a role cannot always read the context (`observation`:
                   contexts it cannot tell apart share one policy), so its best message depends on what
                   its teammates do: chain's best message is right whatever the others do, this one's is
                   not (docs/theory.md section 5b).
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
    # Optional, per layer (K_t,) ints: what the speaker can read of its context. Contexts of one layer with
    # the same observation share one policy (the speaker cannot tell them apart). None: full contexts.
    observation: list[np.ndarray] | None = None

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
        if self.observation is not None:
            if len(self.observation) != len(self.transitions):
                raise ValueError("need one observation array per layer")
            for t, (obs, route) in enumerate(zip(self.observation, self.router, strict=True)):
                if obs.shape != (sizes[t],):
                    raise ValueError(f"layer {t}: observation must give one id per context")
                for o in np.unique(obs):
                    if len(np.unique(route[obs == o])) != 1:
                        raise ValueError(
                            f"layer {t}: contexts sharing observation {o} have different speakers"
                        )

    @property
    def horizon(self) -> int:
        return len(self.transitions)

    @property
    def layer_sizes(self) -> list[int]:
        return [P.shape[0] for P in self.transitions]

    def agent_mask(self, agent: int) -> list[np.ndarray]:
        """Per layer, the contexts where `agent` speaks (its states S_j)."""
        return [route == agent for route in self.router]

    def shared_advantages(
        self, occupancy: list[np.ndarray], advantages: list[np.ndarray]
    ) -> list[np.ndarray]:
        """The advantages an update can act on when contexts sharing an observation share one policy:
        per observation, the occupancy-weighted mean of A over its contexts (the plain mean where the
        occupancy is zero). With tied logits, pi_new ∝ pi_cur exp(eta * mean A) keeps them tied, and its
        surrogate sum_s d(s) sum_m pi_new(m|s) mean_A(m) equals the exact one. Without observations: A."""
        if self.observation is None:
            return advantages
        out = []
        for obs, d, A in zip(self.observation, occupancy, advantages, strict=True):
            tied = np.empty_like(A)
            for o in np.unique(obs):
                rows = obs == o
                w = d[rows]
                w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
                tied[rows] = w @ A[rows]
            out.append(tied)
        return out

    def tie(self, logits: list[np.ndarray]) -> list[np.ndarray]:
        """Logits made equal across contexts that share an observation (the first context's row wins)."""
        if self.observation is None:
            return logits
        out = []
        for obs, z in zip(self.observation, logits, strict=True):
            z = z.copy()
            for o in np.unique(obs):
                rows = np.flatnonzero(obs == o)
                z[rows] = z[rows[0]]
            out.append(z)
        return out

    def agent_index(self, role: str) -> int:
        try:
            return self.agent_names.index(role)
        except ValueError:
            raise ValueError(f"unknown role {role!r}; roles are {self.agent_names}") from None


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


def convention_instance(
    n_agents: int,
    rng: np.random.Generator | None = None,
    rounds: int = 2,
    conventions: int = 3,
    legibility: float = 0.0,
    gamma: float = 1.0,
) -> TeamInstance:
    """A team whose roles must end in the convention the episode started in, and cannot always read
    which one the running message is in: a role's best message depends on what its teammates do.

    T = rounds * n_agents turns, agent t mod n at turn t. The running message is written in one of
    C = `conventions` conventions; the context holds its offset o in Z_C from the one the episode
    started in. Message m rewrites it m steps on (o -> o + m mod C): m = 0 continues in the convention
    in use, m != 0 switches (the first message: m != 0 is a slip, e.g. a role's typical error). The next
    speaker reads o with probability `legibility`; otherwise it sees only that a message is there (one
    observation for every o), so whether to switch back is a bet on what the earlier roles did and on
    whether a later one will switch back too (two corrections of one slip are a new error). Reward 1 if
    the episode ends at offset 0, else 0.

    Contexts at turn t >= 1: o (offset o, legible) and C + o (offset o, illegible); observations: o if
    legible, C if not; turn 0 has one context. `rng` is unused (the structure is fixed; the warm start,
    `convention_warm_logits`, is random); it is accepted for the same call shape as `chain_instance`.
    """
    del rng
    if n_agents < 1 or rounds < 1 or conventions < 2 or not 0.0 <= legibility <= 1.0:
        raise ValueError("need n_agents >= 1, rounds >= 1, conventions >= 2, legibility in [0, 1]")
    speakers = [t % n_agents for t in range(rounds * n_agents)]
    return offset_team(n_agents, speakers, conventions, legibility, gamma, "convention")


def offset_team(
    n_agents: int, speakers: list[int], values: int, legibility: float, gamma: float, name: str
) -> TeamInstance:
    """The team of `convention_instance` and `relay_instance`: the context is an offset o in Z_values
    from where the episode started, message m moves it to o + m, the next speaker (speakers[t] at turn
    t) reads o with probability `legibility` (else one observation for every o), reward 1 iff the
    episode ends at offset 0. Turn 0 has one context; turn t >= 1: o (legible) and V + o (not)."""
    V = values

    def arrive(offset: int) -> np.ndarray:  # the next context: offset, legible with prob. `legibility`
        row = np.zeros(2 * V)
        row[offset % V] = legibility
        row[V + offset % V] = 1.0 - legibility
        return row

    transitions = [np.stack([arrive(m) for m in range(V)])[None]]  # (1, V, 2V)
    for _t in range(1, len(speakers)):
        P = np.zeros((2 * V, V, 2 * V))
        for o in range(V):
            for m in range(V):
                P[o, m] = P[V + o, m] = arrive(o + m)
        transitions.append(P)
    router = [np.full(P.shape[0], speakers[t]) for t, P in enumerate(transitions)]
    reads = np.concatenate([np.arange(V), np.full(V, V)])
    observation = [np.zeros(1, dtype=int)] + [reads.copy() for _ in range(1, len(speakers))]
    reward = np.zeros(2 * V)
    reward[[0, V]] = 1.0
    return TeamInstance(
        n_agents, V, np.ones(1), transitions, router, reward, gamma, name=name, observation=observation
    )


def convention_warm_logits(
    instance: TeamInstance,
    rng: np.random.Generator,
    competence: float = 4.0,
    slip: float = 4.0,
    noise: float = 0.5,
) -> list[np.ndarray]:
    """A warm start for `convention_instance`: N(0, noise^2) logits plus `competence` on continuing in
    the convention in use (message 0) where the offset is unreadable and on restoring offset 0 where it
    is readable; agent 0 also has a typical slip, `slip` on switching one step (message 1) in all its
    contexts (slip = competence: it slips about half the time). Logits are tied per observation."""
    C = instance.n_messages
    logits = []
    for t, route in enumerate(instance.router):
        z = noise * rng.standard_normal((len(route), C))
        z[:, 0] += competence
        if t > 0:
            for o in range(C):  # readable: write the message that brings the offset back to 0
                z[o] = noise * rng.standard_normal(C)
                z[o, (-o) % C] += competence
        z[route == 0, 1] += slip
        logits.append(z)
    return instance.tie(logits)


def relay_speakers(n_agents: int, rounds: int = 2) -> list[int]:
    """Who speaks at each turn of the blind relay: agent 0 once (it holds the value), then agents
    1..n-1 round-robin for `rounds` rounds (tasks/relay.py `RelayOrder`)."""
    if n_agents < 2 or rounds < 1:
        raise ValueError("the relay needs n_agents >= 2 and rounds >= 1")
    return [0] + [1 + k % (n_agents - 1) for k in range(rounds * (n_agents - 1))]


def relay_instance(
    n_agents: int,
    rng: np.random.Generator | None = None,
    rounds: int = 2,
    values: int = 10,
    legibility: float = 0.0,
    gamma: float = 1.0,
) -> TeamInstance:
    """The exact twin of the LLM `relay` task (tasks/relay.py): a blind relay of one value.

    Agent 0 sees the private input (the value) and writes it, or its typical slip, once; then agents
    1..n-1 take `rounds` turns each, round-robin, each seeing only the transcript and writing the value
    it believes: a copy, or a correction. A message is a shift m in Z_`values` of the value written so
    far (the context is its offset o from the true value). A later agent reads o with probability
    `legibility` (the LLM task's knob: that role also sees the private input), otherwise it has one
    observation for every o, as in `convention_instance` (two corrections of one slip are a new error).
    Reward 1 iff the episode ends at offset 0.

    Legibility is drawn per turn here and per role and episode in the LLM task (a role's view is its
    system prompt, the same in both its turns): the two agree exactly at legibility 0 and 1.
    """
    del rng
    if values < 2 or not 0.0 <= legibility <= 1.0:
        raise ValueError("need values >= 2 and legibility in [0, 1]")
    return offset_team(n_agents, relay_speakers(n_agents, rounds), values, legibility, gamma, "relay")


def relay_warm_logits(
    instance: TeamInstance,
    rng: np.random.Generator,
    slip: float = 0.6,
    correction: float = 0.05,
    stray: float = 0.02,
    noise: float = 0.0,
    first_stray: float | None = None,
) -> list[np.ndarray]:
    """The warm start of `relay_instance`, as the LLM warm start's demonstrations are drawn
    (tasks/relay.py `demonstration`): agent 0 writes the true value with probability 1 - slip and
    its slip (true + 1) otherwise; a blind agent copies with probability 1 - correction
    and corrects the typical slip (value - 1) otherwise; an agent that reads the offset writes the true
    value. `stray` of the mass is spread over every other message (what SFT leaves there; agent 0's
    own `first_stray`, default `stray`), and N(0, noise^2) is added to the logits. Logits are tied per
    observation."""
    V = instance.n_messages

    def logits_of(p: dict[int, float], lost: float = stray) -> np.ndarray:
        probs = np.full(V, lost / max(V - len(p), 1))
        for m, q in p.items():
            probs[m % V] = q * (1.0 - lost)
        return np.log(probs) + noise * rng.standard_normal(V)

    logits = []
    for t, route in enumerate(instance.router):
        z = np.zeros((len(route), V))
        for s, agent in enumerate(route):
            legible, o = (s < V, s % V) if t > 0 else (True, 0)
            if agent == 0:
                z[s] = logits_of({-o: 1.0 - slip, 1 - o: slip}, stray if first_stray is None else first_stray)
            elif legible:
                z[s] = logits_of({-o: 1.0})
            else:
                z[s] = logits_of({0: 1.0 - correction, -1: correction})
        logits.append(z)
    return instance.tie(logits)
