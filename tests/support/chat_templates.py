"""Chat templates as test data (Jinja strings in the style of real models' templates) on the character
tokenizer (tests/graphs/test_chat_templates.py, tests/graphs/test_tool_calls.py)."""

from __future__ import annotations

from teamtr.training.tiny_models import build_char_tokenizer

CHATML = (  # SmolLM2 / Qwen style: role markers, `name` dropped
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

STRICT = (  # Gemma style: no system role, strict user/model alternation, `name` dropped
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

def tokenizer(template: str):
    tok = build_char_tokenizer()
    tok.chat_template = template
    tok.name_or_path = f"test-{template[:12]}"
    return tok

