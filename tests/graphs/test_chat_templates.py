"""A team's context through real chat-template styles: authorship survives templates that drop `name`,
templates without a system role or with strict alternation render, template kwargs pass through.

The templates are test data (Jinja strings in the style of ChatML, Llama 3, Gemma, a name-rendering one
and Qwen 3's thinking switch) on the character tokenizer, so every check runs in milliseconds; one test
renders a team through the real SmolLM2 tokenizer: tests/engines/test_models.py.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from teamtr.graphs.chat_format import (
    ChatFormat,
    ChatTemplateError,
    adapt_chat_dicts,
    render_prompt,
    render_prompt_ids,
    template_traits,
)
from teamtr.graphs.roles import Role, role_messages
from teamtr.training.tiny_models import CHAT_TEMPLATE as DEMO_TEMPLATE
from teamtr.training.tiny_models import build_char_tokenizer
from tests.support.chat_templates import CHATML, STRICT, tokenizer

LLAMA3 = (  # Llama 3 style: BOS, header ids, <|eot_id|>, `name` dropped
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
NAMED = (  # a template that keeps `name`
    "{% for m in messages %}[{{ m['role'] }}{% if m.name %} name={{ m.name }}{% endif %}] {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)
THINKING = (  # Qwen 3 style switch: enable_thinking=False pre-fills an empty thought
    CHATML[: CHATML.index("{% if add_generation_prompt")]
    + "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)

ROLES = [Role(f"adder{k}", f"You are adder{k}.") for k in (1, 2, 3)]
# two rounds: adder2 acts for the second time and sees its own first message among the others'
TRANSCRIPT = [("adder1", "10+9+5"), ("adder2", "19+5"), ("adder3", "24"), ("adder1", "24 again")]


def context(acting: str = "adder2") -> list:
    role = next(r for r in ROLES if r.name == acting)
    return role_messages(role, "3+7+9+5", TRANSCRIPT)


@pytest.mark.parametrize(
    ("template", "roles", "names", "system", "strict"),
    [
        (CHATML, True, False, "rendered", False),
        (LLAMA3, True, False, "rendered", False),
        (STRICT, True, False, "refused", True),
        (NAMED, True, True, "rendered", False),
        (DEMO_TEMPLATE, False, False, "rendered", False),
    ],
)
def test_probe_finds_what_each_template_keeps(template, roles, names, system, strict):
    t = template_traits(tokenizer(template))
    assert (t.renders_roles, t.renders_names, t.system, t.strict_alternation) == (roles, names, system, strict)


def test_role_messages_are_seen_from_the_acting_role():
    msgs = context("adder2")
    assert isinstance(msgs[0], SystemMessage) and isinstance(msgs[1], HumanMessage) and msgs[1].name is None
    kinds = [(type(m).__name__, m.name) for m in msgs[2:]]
    assert kinds == [
        ("HumanMessage", "adder1"),
        ("AIMessage", "adder2"),
        ("HumanMessage", "adder3"),
        ("HumanMessage", "adder1"),
    ]


def test_chatml_names_other_roles_and_keeps_own_messages_unprefixed():
    text = render_prompt(tokenizer(CHATML), context("adder2"))
    assert text == (
        "<|im_start|>system\nYou are adder2.<|im_end|>\n"
        "<|im_start|>user\n3+7+9+5<|im_end|>\n"
        "<|im_start|>user\nadder1: 10+9+5<|im_end|>\n"
        "<|im_start|>assistant\n19+5<|im_end|>\n"
        "<|im_start|>user\nadder3: 24<|im_end|>\n"
        "<|im_start|>user\nadder1: 24 again<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama3_style_renders_authors_and_bos():
    tok = tokenizer(LLAMA3)
    text = render_prompt(tok, context("adder3"))
    assert text.startswith(tok.bos_token + "<|start_header_id|>system<|end_header_id|>\n\nYou are adder3.")
    assert "<|start_header_id|>user<|end_header_id|>\n\nadder2: 19+5<|eot_id|>" in text
    assert "<|start_header_id|>assistant<|end_header_id|>\n\n24<|eot_id|>" in text  # adder3's own message
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_strict_alternation_without_system_role_folds_and_merges():
    tok = tokenizer(STRICT)
    dicts = adapt_chat_dicts(tok, context("adder2"))
    assert [d["role"] for d in dicts] == ["user", "assistant", "user"]
    assert dicts[0]["content"] == "You are adder2.\n\n3+7+9+5\n\nadder1: 10+9+5"
    assert dicts[1]["content"] == "19+5"
    assert dicts[2]["content"] == "adder3: 24\n\nadder1: 24 again"
    text = render_prompt(tok, context("adder2"))
    assert text.endswith("<start_of_turn>user\nadder3: 24\n\nadder1: 24 again<end_of_turn>\n<start_of_turn>model\n")
    # the first role acts on system + task only: one user turn
    assert render_prompt(tok, role_messages(ROLES[0], "1+2", [])) == (
        "<start_of_turn>user\nYou are adder1.\n\n1+2<end_of_turn>\n<start_of_turn>model\n"
    )


def test_a_template_that_keeps_names_gets_them_natively():
    text = render_prompt(tokenizer(NAMED), context("adder2"))
    assert "[user name=adder1] 10+9+5\n" in text and "adder1: " not in text
    assert "[assistant name=adder2] 19+5\n" in text


def test_authorship_is_configurable():
    named = render_prompt(tokenizer(NAMED), context("adder2"), ChatFormat(authorship="prefix"))
    assert "[user name=adder1] adder1: 10+9+5\n" in named
    chatml = render_prompt(tokenizer(CHATML), context("adder2"), ChatFormat(authorship="native"))
    assert "<|im_start|>user\n10+9+5<|im_end|>" in chatml  # the author is lost: what native means here
    custom = render_prompt(tokenizer(CHATML), context("adder2"), ChatFormat(name_prefix="[{name}] "))
    assert "<|im_start|>user\n[adder1] 10+9+5<|im_end|>" in custom
    with pytest.raises(ValueError, match="authorship"):
        ChatFormat(authorship="anonymous")  # type: ignore[arg-type]


def test_template_kwargs_pass_through():
    tok = tokenizer(THINKING)
    plain = render_prompt(tok, context())
    off = render_prompt(tok, context(), ChatFormat(template_kwargs={"enable_thinking": False}))
    assert off == plain + "<think>\n\n</think>\n\n"


def test_demo_template_renders_as_before():
    """The character model's plain format (contents only) is unchanged: no prefixes, same ids."""
    tok = tokenizer(DEMO_TEMPLATE)
    text = render_prompt(tok, context("adder2"))
    assert text == "You are adder2.\n3+7+9+5\n10+9+5\n19+5\n24\n24 again\n"
    assert render_prompt_ids(tok, context("adder2")) == tok(text, add_special_tokens=False)["input_ids"]


def test_ids_are_the_rendered_text_tokenised_once():
    tok = tokenizer(CHATML)
    ids = render_prompt_ids(tok, context())
    assert tok.decode(ids) == render_prompt(tok, context())


def test_templates_that_cannot_render_a_team_fail_clearly():
    tok = build_char_tokenizer()
    tok.chat_template = None
    tok.name_or_path = "no-template-model"
    with pytest.raises(ChatTemplateError, match="no-template-model.*no chat template"):
        render_prompt(tok, context())
    only_users = "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ raise_exception('no') }}{% endif %}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="cannot render a user turn followed by an assistant turn"):
        render_prompt(tokenizer(only_users), context())
    # a template that refuses the `tool` role gets tool results as user turns (docs/graphs.md "Tools")
    no_tool_role = "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}x{% endfor %}"
    assert render_prompt(tokenizer(no_tool_role), [HumanMessage("q"), AIMessage("a"), _tool_message()]) == "xxx"
    # one that refuses the context whatever shape it is given still fails clearly
    refuses_results = "{% for m in messages %}{% if 'result' in m['content'] %}{{ raise_exception('no') }}{% endif %}x{% endfor %}"
    with pytest.raises(ChatTemplateError, match="refused this context"):
        render_prompt(tokenizer(refuses_results), [HumanMessage("q"), AIMessage("a"), _tool_message()])


def _tool_message():
    from langchain_core.messages import ToolMessage

    return ToolMessage("result", tool_call_id="1")


def test_a_team_on_the_engine_renders_through_its_chat_format(tmp_path):
    """End to end: the prompt each role's turn records is the ChatML context with the authors written in."""
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.graphs.engine import SamplingParams
    from teamtr.graphs.team import Team
    from tests.support.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "chatml-model")
    tok = build_char_tokenizer()
    tok.chat_template = CHATML
    tok.save_pretrained(model)
    engine = EmbeddedEngine(model, device="cpu")
    sampling = SamplingParams(max_new_tokens=4)
    roles = [Role(f"adder{k}", f"You are adder{k}.", sampling=sampling) for k in (1, 2, 3)]
    team = Team.from_engine(roles, engine, chat_format=ChatFormat(name_prefix="<{name}> "))
    turns = team.run([_task("3+7+9+5")], seed=0)[0].turns
    last = engine.tokenizer().decode(turns[2].prompt_ids)
    assert last.startswith("<|im_start|>system\nYou are adder3.<|im_end|>\n<|im_start|>user\n3+7+9+5<|im_end|>\n")
    assert f"<|im_start|>user\n<adder1> {turns[0].text}<|im_end|>\n" in last
    assert last.endswith(f"<|im_start|>user\n<adder2> {turns[1].text}<|im_end|>\n<|im_start|>assistant\n")


def _task(prompt: str):
    from teamtr.graphs.task import TaskInstance

    return TaskInstance(id="t", prompt=prompt, answer=None)


def test_a_team_whose_template_cannot_render_it_fails_when_built(tmp_path):
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.graphs.team import Team
    from tests.support.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "solo-model")
    tok = build_char_tokenizer()
    # renders every shape the probes try, but refuses a user turn with a name (another role's message)
    tok.chat_template = (
        "{% for m in messages %}{% if m.name is defined and m['role'] == 'user' %}"
        "{{ raise_exception('named users') }}{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    tok.save_pretrained(model)
    engine = EmbeddedEngine(model, device="cpu")
    with pytest.raises(ChatTemplateError, match="solo-model.*cannot render a team's context.*named users"):
        Team.from_engine(ROLES, engine)
