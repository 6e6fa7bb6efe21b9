"""The chat-completion service the routes call: validate a request, pick its team, admit it, run and
record its episodes, and build the OpenAI-shaped response or stream of chunks (the routes in
serving/app.py stay thin over it).

The user's last message is the task; earlier messages of the request are context, folded into the task
text as `<role>: <content>` lines (a Team sees one task string); a user graph (graphs/user_graph.py)
whose input is LangGraph's MessagesState gets the messages themselves, as LangChain messages. Every
request runs on a thread, its conversation id (the one it names, else its completion id): the graph
continues the thread's checkpointed state (serving/threads.py, docs/serving.md "Threads"), and
only the messages new to the thread go in (a client resending the whole conversation is recognised by
the digests of the messages it has seen). Requests on one thread take turns. Sampling fields
apply to every role under the team's pins (serving/sampling.py); `n` runs n episodes, one choice each;
`seed` seeds every episode (choice i > 0 with a seed derived from it). Admission, rate limits
(serving/limits.py), the deadline and a client that goes away bound every request: the episode task is cancelled, so its adapter pins and its
place in the team's queue are released.

Validation, the unstreamed response and the token stream share one `Completion` and its admission and
deadline. Beside this module, one job each: the request's limits and deadline (serving/completion.py),
its thread (serving/threads.py), the stream of server-sent events (serving/chat_stream.py), which
streamed tokens are the answer (serving/token_stream.py), what the messages become (task text, LangChain
messages, usage: serving/chat_messages.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from langgraph.checkpoint.base import BaseCheckpointSaver

from teamtr.client.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    ChoiceInfo,
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    ResponseMessage,
    TeamInfo,
    TurnInfo,
)
from teamtr.graphs.team import derive_seed
from teamtr.serving.chat_messages import chat_messages, task_text, usage_of
from teamtr.serving.chat_stream import event_stream
from teamtr.serving.completion import Completion, checked_n, deadline_error, request_timeout
from teamtr.serving.episodes import EpisodeResult, ServedEpisodeRunner, ServedTeam, turn_info
from teamtr.serving.errors import APIError
from teamtr.serving.exploration import ExplorationDraw
from teamtr.serving.limits import AdmissionGate, RateLimiter
from teamtr.serving.metrics import ServingMetrics
from teamtr.serving.registry import AdapterRegistry
from teamtr.serving.sampling import TeamVariants, described, refuse_fully_pinned, request_overrides
from teamtr.serving.settings import ServeSettings
from teamtr.serving.threads import ConversationThreads
from teamtr.serving.tracing import TeamTracer

T = TypeVar("T")
Disconnected = Callable[[], Awaitable[None]]  # returns when the client has gone away


class ChatCompletionService:
    def __init__(
        self,
        teams: dict[str, ServedTeam],
        registry: AdapterRegistry,
        tracer: TeamTracer | None,
        settings: ServeSettings,
        runner: ServedEpisodeRunner,
        threads: ConversationThreads,
    ) -> None:
        self.teams, self.registry, self.tracer, self.settings = teams, registry, tracer, settings
        self.runner, self.threads = runner, threads
        self.gates = {
            name: AdmissionGate(name, settings.policy(name).max_in_flight, settings.policy(name).max_waiting)
            for name in teams
        }
        self.variants = {
            name: TeamVariants(t.team, settings.policy(name).pinned) for name, t in teams.items()
        }
        self.exploration = {
            name: ExplorationDraw(p.exploration_share, p.exploration_temperature, p.exploration_seed)
            for name, p in ((name, settings.policy(name)) for name in teams)
        }
        self.rate = (
            RateLimiter(settings.rate_limit_rpm, settings.rate_limit_burst)
            if settings.rate_limit_rpm is not None
            else None
        )
        self.metrics = ServingMetrics(self.gates, registry)

    # ---- chat completions -----------------------------------------------------------------------

    def check_rate(self, key: str) -> None:
        """429 when this API key (or client address, on an open server) is over its rate limit."""
        if self.rate is not None:
            self.rate.take(key)

    def prepare(
        self,
        request: ChatCompletionRequest,
        conversation_header: str | None,
        timeout_header: str | None = None,
        owner: str | None = None,
    ) -> Completion:
        """Check the request against the served teams and the server's limits (APIError if it fails);
        `owner`: whose conversations it may continue."""
        team = self.teams.get(request.model)
        if team is None:
            raise APIError(
                404,
                f"the model {request.model!r} does not exist; teams: {sorted(self.teams)}",
                param="model",
                code="model_not_found",
            )
        n = checked_n(request, self.settings)
        self.gates[request.model].check(n)
        timeout_s = request_timeout(request.timeout, timeout_header, self.settings.request_timeout_s)
        variants = self.variants[request.model]
        asked = request_overrides(request)
        refuse_fully_pinned(team.team, variants.pinned, asked)
        given = (request.metadata.conversation_id if request.metadata else None) or conversation_header
        known = 0
        if given:  # a thread: its state holds what came before (an unknown id starts a new thread)
            known = self.threads.known_messages(given[:256], request.messages, owner)
        new_messages = request.messages[known:]
        task = task_text(new_messages)
        tokenizer = self.registry.engine.tokenizer(team.team.roles[0].base_model)
        n_tokens = len(tokenizer(task, add_special_tokens=False)["input_ids"])
        if n_tokens > self.settings.max_prompt_tokens:
            raise APIError(
                400,
                f"the conversation is {n_tokens} tokens; this server takes at most "
                f"{self.settings.max_prompt_tokens}",
                param="messages",
                code="context_length_exceeded",
            )
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        conversation_id = given[:256] if given else completion_id
        return Completion(
            request,
            team,
            task,
            completion_id,
            conversation_id,
            graph=variants.team_for(asked),
            sampling=variants.sampling_of(asked),
            asked=asked,
            n=n,
            timeout_s=timeout_s,
            new_messages=new_messages,
            known=known,
            owner=owner,
        )

    async def _bounded(self, c: Completion, work: Coroutine[Any, Any, T], disconnected: Disconnected) -> T:
        """Run `work` until it ends, the deadline passes (408) or the client goes away (its task is
        cancelled either way, and awaited, so what it held is released before this returns)."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({task, gone}, timeout=max(0.0, c.remaining()), return_when="FIRST_COMPLETED")
        finally:
            for t in (task, gone):
                t.cancel()
            await asyncio.gather(task, gone, return_exceptions=True)
        if task.done() and not task.cancelled():
            return task.result()
        if gone.done() and not gone.cancelled():
            raise APIError(499, "the client closed the request", code="client_closed_request")
        raise deadline_error(c.timeout_s)

    async def admit(self, c: Completion, disconnected: Disconnected) -> None:
        """Wait for the request's places in its team's queue (429 if full); release with `release`."""
        await self._bounded(c, self.gates[c.request.model].acquire(c.n), disconnected)

    def release(self, c: Completion) -> None:
        self.gates[c.request.model].release(c.n)

    async def complete(self, c: Completion, disconnected: Disconnected) -> ChatCompletionResponse:
        await self.admit(c, disconnected)
        try:
            results = await self._bounded(c, self._run_all(c), disconnected)
        finally:
            self.release(c)
        return self._response(c, results)

    async def _run_all(self, c: Completion) -> list[EpisodeResult]:
        async with self.threads.continued(c.conversation_id, c.owner, c.n) as savers:
            async with asyncio.TaskGroup() as group:  # one episode failing cancels the others
                tasks = [group.create_task(self._run(c, i, savers[i])) for i in range(c.n)]
        return [t.result() for t in tasks]

    async def _run_streamed(
        self,
        c: Completion,
        on_turn: Callable[[TurnInfo], None] | None,
        on_token: Callable[[int, str, str], None],
    ) -> EpisodeResult:
        async with self.threads.continued(c.conversation_id, c.owner) as (saver,):
            return await self._run(c, 0, saver, on_turn, on_token)

    def _response(self, c: Completion, results: list[EpisodeResult]) -> ChatCompletionResponse:
        first = results[0]
        turns = [[turn_info(i, turn) for i, turn in enumerate(r.trajectory.turns)] for r in results]
        return ChatCompletionResponse(
            id=c.completion_id,
            model=c.request.model,
            choices=[
                Choice(
                    index=i,
                    message=ResponseMessage(content=r.trajectory.final_answer or ""),
                    finish_reason=r.finish_reason,
                )
                for i, r in enumerate(results)
            ],
            usage=usage_of(*(r.trajectory for r in results)),
            teamtr=TeamInfo(
                conversation_id=c.conversation_id,
                adapter_versions=first.adapter_versions,
                turns=turns[0],
                sampling=described(c.sampling),
                choices=[
                    ChoiceInfo(index=i, adapter_versions=r.adapter_versions, turns=turns[i])
                    for i, r in enumerate(results)
                ]
                if len(results) > 1
                else None,
            ),
        )

    def stream(self, c: Completion) -> AsyncIterator[str]:
        """The request's server-sent events (serving/chat_stream.py); the request's places in the queue
        (taken by `admit`) are released when the stream ends."""
        return event_stream(
            c,
            lambda on_turn, on_token: self._run_streamed(c, on_turn, on_token),
            lambda: self.release(c),
            self.metrics.first_content_seconds.labels(c.request.model).observe,
        )

    async def _run(
        self,
        c: Completion,
        index: int,
        checkpointer: BaseCheckpointSaver,
        on_turn: Callable[[TurnInfo], None] | None = None,
        on_token: Callable[[int, str, str], None] | None = None,
    ) -> EpisodeResult:
        seed = c.request.seed
        if seed is not None and index > 0:  # choice 0 is the n = 1 answer; the others differ from it
            seed = derive_seed(seed, index)
        team = c.request.model
        graph, explore = c.graph, self._explores(c)
        if explore:  # this episode samples at the training temperature (serving/exploration.py)
            asked = {**c.asked, **self.exploration[team].overrides()}
            graph = self.variants[team].team_for(asked)
            if index == 0:  # the response's `sampling` says what choice 0 sampled with
                c.sampling = self.variants[team].sampling_of(asked)
        result = await self.runner.run(
            team,
            c.team,
            c.task,
            seed=seed,
            completion_id=c.completion_id,
            conversation_id=c.conversation_id,
            on_turn=on_turn,
            graph=graph,
            exploration=explore,
            observe_turn=self.metrics.turn_observer(team),
            messages=chat_messages(c.new_messages),
            on_token=on_token,
            checkpointer=checkpointer,
            owner=c.owner,
        )
        if index == 0:  # the thread continues from choice 0's answer; committed before it is answered
            answer = result.trajectory.final_answer or ""
            await self.threads.record_answer(c.conversation_id, c.new_messages, answer, c.known)
        self.metrics.episode_seconds.labels(team).observe(result.seconds)
        self.gates[team].observe_episode(result.seconds)
        return result

    def _explores(self, c: Completion) -> bool:
        """The episode's draw; a request that chose its own temperature or top_p is never explored."""
        if "temperature" in c.asked or "top_p" in c.asked:
            return False
        return self.exploration[c.request.model].draw()

    # ---- the other chat-API endpoints -------------------------------------------------------------

    def models(self) -> ModelList:
        return ModelList(data=[self.model(name) for name in sorted(self.teams)])

    def model(self, name: str) -> ModelCard:
        if name not in self.teams:
            raise APIError(404, f"the model {name!r} does not exist", param="model", code="model_not_found")
        return ModelCard(id=name, roles=[r.name for r in self.teams[name].team.roles])

    def feedback(self, body: FeedbackRequest, owner: str | None = None) -> FeedbackResponse:
        """A reward from the conversation's owner, within the server's declared reward range."""
        self.threads.check_owner(body.conversation_id, owner, must_exist=True)
        low, high = self.settings.reward_range
        if not low <= body.reward <= high:
            raise APIError(
                400,
                f"reward {body.reward:g} is outside this server's reward range [{low:g}, {high:g}]",
                param="reward",
                code="reward_out_of_range",
            )
        if self.tracer is None:
            raise APIError(
                409, "tracing is off on this server, so a reward has nowhere to go", code="tracing_disabled"
            )
        self.tracer.record_feedback(body.conversation_id, body.reward, body.comment)
        return FeedbackResponse(
            conversation_id=body.conversation_id,
            reward=body.reward,
            episodes=self.threads.episodes(body.conversation_id),
        )

    def health(self) -> HealthResponse:
        return HealthResponse(
            teams=sorted(self.teams),
            adapters=self.registry.current_versions(),
            in_flight=self.registry.in_flight(),
        )
