"""Tool calls: parsing completions into AIMessage.tool_calls, rendering tools / calls / results through
chat templates with and without native tool support, and a LangGraph `ToolNode` loop around a real
embedded engine whose turns record the calls and whose later prompts hold the tools' results.

Templates are test data on the character tokenizer (a ChatML-with-tools template in the style of Qwen
2.5, plain ChatML and a Gemma-style strict one); SmolLM2's real template is marked slow. A random tiny
model never writes a tool call, so one test first teaches a tiny Llama (~100 steps, seconds) to write a
fixed call, a fixed answer after the result and a fixed malformed call, then runs the real
`EngineChatModel` in a `model -> tools_condition -> ToolNode -> model` graph.
"""

from __future__ import annotations

import asyncio
import json
import warnings

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel, Field

from teamtr.graphs.capture import run_episode
from teamtr.graphs.capture_callback import ForeignModelWarning
from teamtr.graphs.chat_format import render_prompt, template_traits
from teamtr.graphs.chat_model import EngineChatModel, turn_from_reply
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.tool_calls import format_tool_call, parse_tool_calls, tools_system_section
from teamtr.graphs.trajectory import Trajectory, Turn
from tests.support.chat_templates import CHATML, STRICT, tokenizer

# ChatML with native tools (Qwen 2.5 style): tools in the system turn, calls inside the assistant turn,
# results as user turns wrapped in <tool_response>. transformers renders with trim_blocks, so a newline
# right after a block tag is written as {{ '\n' }}.
CHATML_TOOLS = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n"
    "{% endif %}# Tools\n<tools>{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}{{ '\\n' }}</tools><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% elif m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'] }}"
    "{% for c in m.tool_calls or [] %}{{ '\\n' }}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """A tool that always fails."""
    raise RuntimeError(f"boom: {reason}")


class Lookup(BaseModel):
    """Look a word up."""

    word: str = Field(description="the word")


OPENAI_TOOL = {
    "type": "function",
    "function": {
        "name": "shout",
        "description": "Shout a text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}


def tool_dicts() -> list[dict]:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return [convert_to_openai_tool(add)]


def called_context() -> list:
    """A context where the assistant called `add` and the tool answered."""
    return [
        SystemMessage("You add."),
        HumanMessage("2+3?"),
        AIMessage("Let me add.", tool_calls=[tool_call(name="add", args={"a": 2, "b": 3}, id="call_9")]),
        ToolMessage("5", tool_call_id="call_9", name="add"),
    ]


# ---- parsing ----------------------------------------------------------------------------------------


def test_a_well_formed_call_becomes_a_tool_call_and_leaves_the_text():
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls, invalid = parse_tool_calls(text)
    assert content == "Let me add."
    assert calls == [{"name": "add", "args": {"a": 2, "b": 3}, "id": "call_0", "type": "tool_call"}]
    assert invalid == []
    assert parse_tool_calls(format_tool_call("add", {"a": 1, "b": 1}))[1][0]["args"] == {"a": 1, "b": 1}


def test_several_calls_keep_their_order_and_ids():
    text = format_tool_call("add", {"a": 1, "b": 2}) + "\n" + format_tool_call("shout", {"text": "hi"})
    _, calls, invalid = parse_tool_calls(text, lambda k: f"id{k}")
    assert [(c["name"], c["id"]) for c in calls] == [("add", "id0"), ("shout", "id1")] and not invalid


@pytest.mark.parametrize(
    ("block", "error", "name"),
    [
        ('{"name": "add", "arguments": {"a": 2,}}', "not JSON", "add"),
        ('{"name": "add"}', "expected exactly", "add"),
        ('{"name": "add", "arguments": {"a": 1}, "extra": 1}', "expected exactly", "add"),
        ('{"name": "add", "arguments": "{\\"a\\": 1}"}', "arguments must be a JSON object", "add"),
        ('{"name": 3, "arguments": {}}', "name must be a non-empty string", None),
        ('["add", {"a": 1}]', "expected exactly", None),
    ],
)
def test_a_malformed_call_is_invalid_and_stays_in_the_text(block, error, name):
    text = f"ok <tool_call>{block}</tool_call>"
    content, calls, invalid = parse_tool_calls(text)
    assert calls == [] and content == text  # nothing repaired, nothing removed
    assert len(invalid) == 1 and invalid[0]["args"] == block and error in invalid[0]["error"]
    assert invalid[0]["name"] == name and invalid[0]["id"] == "call_0"


def test_an_unclosed_call_is_invalid_and_a_valid_one_beside_it_is_kept():
    text = format_tool_call("add", {"a": 1, "b": 2}) + ' <tool_call>{"name": "add", "argu'
    content, calls, invalid = parse_tool_calls(text)
    assert [c["name"] for c in calls] == ["add"]
    assert invalid[0]["error"] == "<tool_call> without </tool_call>" and invalid[0]["id"] == "call_1"
    assert content == '<tool_call>{"name": "add", "argu'


def test_text_without_calls_is_unchanged():
    assert parse_tool_calls("just 5\n") == ("just 5\n", [], [])


# ---- rendering ----------------------------------------------------------------------------------------


def test_probes_find_native_and_missing_tool_support():
    native = template_traits(tokenizer(CHATML_TOOLS))
    assert native.renders_tools and native.renders_tool_calls and native.tool_role == "rendered"
    assert native.native_tools and native.renders_roles and native.system == "rendered"
    plain = template_traits(tokenizer(CHATML))
    assert (plain.renders_tools, plain.renders_tool_calls, plain.tool_role) == (False, False, "rendered")
    strict = template_traits(tokenizer(STRICT))
    assert (strict.renders_tools, strict.tool_role, strict.native_tools) == (False, "refused", False)


def test_a_native_template_renders_tools_calls_and_results_itself():
    tok = tokenizer(CHATML_TOOLS)
    text = render_prompt(tok, called_context(), tools=tool_dicts())
    schema = json.dumps(tool_dicts()[0], ensure_ascii=False)
    assert text == (
        f"<|im_start|>system\nYou add.\n\n# Tools\n<tools>\n{schema}\n</tools><|im_end|>\n"
        "<|im_start|>user\n2+3?<|im_end|>\n"
        '<|im_start|>assistant\nLet me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert "# Tools\n\nYou may call" not in text  # the text format is not added on top


def test_a_template_without_tools_gets_the_documented_text_format():
    tok = tokenizer(CHATML)
    text = render_prompt(tok, called_context(), tools=tool_dicts())
    assert text == (
        f"<|im_start|>system\nYou add.\n\n{tools_system_section(tool_dicts())}<|im_end|>\n"
        "<|im_start|>user\n2+3?<|im_end|>\n"
        f"<|im_start|>assistant\nLet me add.\n{format_tool_call('add', {'a': 2, 'b': 3})}<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # what the model is told to write is what the parser reads
    section = tools_system_section(tool_dicts())
    assert '"name": "add"' in section and "<tool_call>" in section
    # no tools bound, no system message: the context renders as before, tool turns included
    bare = render_prompt(tok, called_context()[1:])
    assert bare.startswith("<|im_start|>user\n2+3?") and "# Tools" not in bare


def test_a_strict_template_gets_tool_results_as_user_turns():
    tok = tokenizer(STRICT)
    text = render_prompt(tok, called_context(), tools=tool_dicts())
    assert text.startswith(f"<start_of_turn>user\nYou add.\n\n{tools_system_section(tool_dicts())}\n\n2+3?")
    assert text.endswith(
        f"<start_of_turn>model\nLet me add.\n{format_tool_call('add', {'a': 2, 'b': 3})}<end_of_turn>\n"
        "<start_of_turn>user\n<tool_response>\n5\n</tool_response><end_of_turn>\n<start_of_turn>model\n"
    )


@pytest.mark.slow
def test_smollm2_renders_tools_in_the_system_prompt(smollm2_model_dir):
    from teamtr.engines.embedded import load_tokenizer

    tok = load_tokenizer(smollm2_model_dir)
    traits = template_traits(tok)
    assert not traits.renders_tools and not traits.renders_tool_calls and traits.tool_role == "rendered"
    text = render_prompt(tok, called_context(), tools=tool_dicts())
    assert text == (
        f"<|im_start|>system\nYou add.\n\n{tools_system_section(tool_dicts())}<|im_end|>\n"
        "<|im_start|>user\n2+3?<|im_end|>\n"
        f"<|im_start|>assistant\nLet me add.\n{format_tool_call('add', {'a': 2, 'b': 3})}<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# ---- the chat model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.training.tiny_models import build_char_tokenizer
    from tests.support.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("tools-model"))
    tok = build_char_tokenizer()
    tok.chat_template = CHATML_TOOLS
    tok.save_pretrained(model)
    return EmbeddedEngine(model, device="cpu")


def test_bind_tools_takes_langchain_tools_pydantic_models_and_dicts(engine):
    model = EngineChatModel(engine=engine, sampling=SamplingParams(max_new_tokens=3))
    bound = model.bind_tools([add, Lookup, OPENAI_TOOL])
    names = [t["function"]["name"] for t in bound.kwargs["tools"]]
    assert names == ["add", "Lookup", "shout"]
    reply = asyncio.run(bound.ainvoke([HumanMessage("hi")]))
    prompt = engine.tokenizer().decode(reply.response_metadata["teamtr"]["prompt_ids"])
    for t in bound.kwargs["tools"]:  # every schema went through the template's tools=
        assert json.dumps(t, ensure_ascii=False) in prompt
    assert reply.tool_calls == [] or all(c["name"] for c in reply.tool_calls)
    assert model.bind_tools([add], tool_choice="auto").kwargs["tools"][0]["function"]["name"] == "add"
    for choice in ("any", "required", "add", "none"):
        with pytest.raises(ValueError, match="cannot force or forbid a tool call"):
            model.bind_tools([add], tool_choice=choice)


def test_turns_record_valid_and_invalid_calls_and_survive_traces_and_jsonl(tmp_path):
    reply = AIMessage(
        "x",
        tool_calls=[tool_call(name="add", args={"a": 1, "b": 2}, id="c0")],
        invalid_tool_calls=[invalid_tool_call(name="add", args="{bad", id="c1", error="not JSON")],
    )
    turn = turn_from_reply(reply, "solver")
    assert turn.tool_calls == [{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "c0"}]
    assert turn.invalid_tool_calls == [{"name": "add", "arguments": "{bad", "id": "c1", "error": "not JSON"}]
    traj = Trajectory(task_id="t", turns=[turn])
    assert Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))) == traj
    assert Trajectory.from_dict({"task_id": "t", "turns": [_old_turn_dict()]}).turns[0].tool_calls == []

    from teamtr.serving.tracing import (
        TeamTracer,
        TracingConfig,
        build_tracer_provider,
        trajectories_from_store,
    )

    provider = build_tracer_provider(TracingConfig(sqlite_path=tmp_path / "traces.db"))
    tracer = TeamTracer(provider)
    with tracer.episode("team", "conv", "task") as span:
        tracer.record_turn(span, turn, 0, "conv")
        tracer.finish_episode(span, traj, {})
    tracer.flush()
    back = trajectories_from_store(tmp_path / "traces.db")[0].turns[0]
    assert back.tool_calls == turn.tool_calls and back.invalid_tool_calls == turn.invalid_tool_calls
    tracer.shutdown()


def _old_turn_dict() -> dict:
    """A turn as saved before tool calls existed."""
    return {"role": "r", "adapter": None, "adapter_version": 0, "prompt_ids": [], "completion_ids": [],
            "logprobs": [], "text": ""}


# ---- a ToolNode loop around the real engine -----------------------------------------------------------


def tool_graph(planner, solver, tools):
    """planner -> tools_condition -> ToolNode -> solver -> tools_condition -> ToolNode / END."""

    async def plan(state: MessagesState) -> dict:
        return {"messages": [await planner.ainvoke(state["messages"], config={"metadata": {"teamtr_role": "planner"}})]}

    async def solve(state: MessagesState) -> dict:
        return {"messages": [await solver.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("planner", plan)
    g.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    g.add_node("solver", solve)
    g.add_edge(START, "planner")
    g.add_conditional_edges("planner", tools_condition, {"tools": "tools", END: "solver"})
    g.add_edge("tools", "solver")
    g.add_conditional_edges("solver", tools_condition, {"tools": "tools", END: END})
    return g.compile()


@pytest.mark.parametrize("template", ["native", "text"])
def test_a_tool_node_loop_around_the_engine_records_calls_and_results(tmp_path, template):
    """A scripted planner (a real LangChain fake chat model) calls four tools, three of them badly;
    ToolNode answers each, errors included, and the engine-backed solver acts on the results: its
    prompt ids are the template's rendering of every tool message, and the trajectory has both turns."""
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.training.tiny_models import build_char_tokenizer
    from tests.support.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "m")
    tok = build_char_tokenizer()
    tok.chat_template = CHATML_TOOLS if template == "native" else CHATML
    tok.save_pretrained(model_dir)
    eng = EmbeddedEngine(model_dir, device="cpu")
    calls = [
        tool_call(name="add", args={"a": 2, "b": 3}, id="c_add"),
        tool_call(name="ghost", args={}, id="c_ghost"),  # no such tool
        tool_call(name="add", args={"a": "two"}, id="c_schema"),  # fails the schema
        tool_call(name="explode", args={"reason": "test"}, id="c_raise"),  # the tool raises
    ]
    planned = AIMessage(
        "Calling tools.",
        tool_calls=calls,
        invalid_tool_calls=[invalid_tool_call(name="add", args="{oops", id="c_bad", error="not JSON")],
    )
    planner = GenericFakeChatModel(messages=iter([planned]))
    solver = EngineChatModel(
        engine=eng, role="solver", adapter=None, sampling=SamplingParams(temperature=0.0, max_new_tokens=6)
    ).bind_tools([add, explode])
    graph = tool_graph(planner, solver, [add, explode])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ForeignModelWarning)
        traj = asyncio.run(run_episode(graph, TaskInstance(id="t", prompt="2+3?", answer=None), seed=0))

    plan_turn, solve_turn = traj.turns[0], traj.turns[1]
    assert plan_turn.role == "planner" and not plan_turn.trainable
    assert [c["id"] for c in plan_turn.tool_calls] == ["c_add", "c_ghost", "c_schema", "c_raise"]
    assert plan_turn.invalid_tool_calls == [{"name": "add", "arguments": "{oops", "id": "c_bad", "error": "not JSON"}]
    assert solve_turn.role == "solver" and solve_turn.trainable and solve_turn.node == "solver"

    # the ToolNode's answers, errors included, are the solver's context, as the template renders them
    seen = eng.tokenizer().decode(solve_turn.prompt_ids)
    results = [
        "5",
        "Error: ghost is not a valid tool, try one of [add, explode].",
        "Error: ToolInvocationError(\"Error invoking tool 'add' with kwargs {'a': 'two'} with error:",
        "Error: RuntimeError('boom: test')\n Please fix your mistakes.",
    ]
    opener = "<|im_start|>user\n<tool_response>\n" if template == "native" else "<|im_start|>tool\n<tool_response>\n"
    for r in results:
        assert opener + r in seen, r
    if template == "native":
        assert json.dumps(solver.kwargs["tools"][0], ensure_ascii=False) in seen
    else:
        assert tools_system_section(solver.kwargs["tools"]) in seen
    # the planner's calls are in the context as the template writes them (the invalid one is not a call)
    assert format_tool_call("add", {"a": 2, "b": 3}) in seen and "{oops" not in seen
    # the context is the prompt ids, nothing re-tokenised: the same messages rendered again give them
    assert seen.endswith("<|im_start|>assistant\n")
    assert traj.turns[1:] == [t for t in traj.turns[1:] if t.role == "solver"]


def test_the_solver_turn_alone_is_trained_on(tmp_path):
    """Tool results are prompt ids of later turns: the trainer's mask covers completion ids only."""
    import numpy as np

    from teamtr.training.advantages import Advantages
    from teamtr.training.rollouts import RolloutBatch, messages_of_role

    turn = Turn("solver", None, 0, prompt_ids=[5, 6, 7, 8], completion_ids=[9, 10], logprobs=[-1.0, -2.0],
                text="ab", tool_calls=[{"name": "add", "arguments": {}, "id": "c"}])
    batch = RolloutBatch("s0-k0", 0, 0, [Trajectory(task_id="t", turns=[turn], reward=1.0)])
    adv = Advantages(
        values=np.array([1.0]), unclipped=np.array([1.0]), keep=np.array([True]), zeta_clip=0.0, zeta_norm=0.0, a_max=1.0
    )
    msgs = messages_of_role(batch, "solver", adv)
    assert msgs.prompts == [[5, 6, 7, 8]] and msgs.completions == [[9, 10]]
    assert msgs.mask.tolist() == [[1.0, 1.0]]


# ---- a model that really calls a tool ---------------------------------------------------------------


def _taught_model(out_dir, template: str, examples: list[tuple[list[int], str]], steps: int = 300):
    """A tiny Llama fine-tuned until greedy decoding writes each example's completion after its prompt."""
    import torch
    from transformers import LlamaForCausalLM

    from teamtr.training.tiny_models import build_char_tokenizer, tiny_llama_config

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    tok.chat_template = template
    config = tiny_llama_config(len(tok), hidden=64, layers=2, heads=2)
    config.max_position_embeddings = 1024
    model = LlamaForCausalLM(config)
    rows = []
    for prompt, completion in examples:
        target = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((torch.tensor([prompt + target]), len(prompt)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        opt.zero_grad()
        losses, learnt = [], True
        for ids, n in rows:
            labels = ids.clone()
            labels[0, :n] = -100  # the completion only, as in training
            out = model(input_ids=ids, labels=labels)
            losses.append(out.loss)
            # teacher-forced argmax = the targets, with a loss margin: greedy decoding writes them
            hits = bool((out.logits[0, n - 1 : -1].argmax(-1) == ids[0, n:]).all())
            learnt = learnt and hits and out.loss.item() < 0.05
        if learnt:
            break
        sum(losses).backward()
        opt.step()
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.mark.parametrize("template", ["native", "text"])
def test_the_engine_model_calls_a_tool_and_reads_its_result(tmp_path, template):
    """model -> tools_condition -> ToolNode -> model with an embedded engine whose model was taught to
    call `add` and then answer: the completion's call is parsed into tool_calls, ToolNode runs it, the
    second turn's prompt holds the result rendered by the template, and both turns record it."""
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.graphs.chat_format import render_prompt_ids
    from teamtr.graphs.tool_calls import call_id
    from teamtr.training.tiny_models import build_char_tokenizer

    chat_template = CHATML_TOOLS if template == "native" else CHATML
    tok = build_char_tokenizer()
    tok.chat_template = chat_template
    tools = tool_dicts()
    question = [HumanMessage("2+3?")]
    called = [*question, AIMessage("", tool_calls=[tool_call(name="add", args={"a": 2, "b": 3}, id="c")]),
              ToolMessage("5", tool_call_id="c", name="add")]
    call_text = format_tool_call("add", {"a": 2, "b": 3})
    first, second = render_prompt_ids(tok, question, tools=tools), render_prompt_ids(tok, called, tools=tools)
    bad_text = '<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>'
    bad = render_prompt_ids(tok, [HumanMessage("2+?")], tools=tools)
    model_dir = _taught_model(
        tmp_path / "m", chat_template, [(first, call_text), (second, "It is 5."), (bad, bad_text)]
    )

    eng = EmbeddedEngine(model_dir, device="cpu")
    agent = EngineChatModel(
        engine=eng, role="agent", sampling=SamplingParams(temperature=0.0, max_new_tokens=80)
    ).bind_tools([add])

    async def act(state: MessagesState) -> dict:
        return {"messages": [await agent.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", act)
    g.add_node("tools", ToolNode([add]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    graph = g.compile()
    traj = asyncio.run(run_episode(graph, TaskInstance(id="t", prompt="2+3?", answer=None), seed=0))

    assert [t.role for t in traj.turns] == ["agent", "agent"], [(t.text, len(t.prompt_ids)) for t in traj.turns]
    assert traj.final_answer == "It is 5."
    one, two = traj.turns
    assert one.text == call_text and one.prompt_ids == first and one.invalid_tool_calls == []
    assert one.tool_calls == [
        {"name": "add", "arguments": {"a": 2, "b": 3}, "id": call_id(one.prompt_ids, one.completion_ids, 0)}
    ]
    assert two.tool_calls == [] and two.prompt_ids == second  # the ids the engine saw: the result in them
    seen = eng.tokenizer().decode(two.prompt_ids)
    assert "<tool_response>\n5\n</tool_response>" in seen and call_text in seen
    assert two.trainable and one.trainable  # the call is an action; the result only context

    # a malformed call: an invalid_tool_calls entry, kept in the text, no tool runs, the episode ends
    wrong = asyncio.run(run_episode(graph, TaskInstance(id="b", prompt="2+?", answer=None), seed=0))
    (turn,) = wrong.turns
    assert turn.text == bad_text and turn.tool_calls == [] and wrong.final_answer == bad_text
    (invalid,) = turn.invalid_tool_calls
    assert invalid["name"] == "add" and invalid["error"].startswith("not JSON")
    assert invalid["arguments"] == '{"name": "add", "arguments": {"a": 2,}}'
    assert invalid["id"] == call_id(turn.prompt_ids, turn.completion_ids, 0)
