"""Small models built on this machine (no model hub): a character tokenizer, a Llama config, and an
untrained model made from them (the warm start trains it; tests of other areas use it untrained).

A user with a GPU points the same loading code (`from_pretrained`) at e.g. `Qwen/Qwen3-8B`.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<s>", "</s>"

# Every message is followed by a newline; the engine stops a message at the first "\n".
# Compact on purpose: a character tokenizer pays one token per character of context.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}{{ m['content'] }}{{ '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{%- endif -%}"
)
MESSAGE_END = "\n"


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (plus newline), three specials; ~100 tokens."""
    chars = sorted(set(string.printable) - set("\t\r\x0b\x0c"))
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for c in chars:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=PAD,
        padding_side="left",  # must be given here to survive save_pretrained
        chat_template=CHAT_TEMPLATE,
    )


def tiny_llama_config(vocab_size: int, hidden: int = 128, layers: int = 4, heads: int = 4) -> LlamaConfig:
    """head size = hidden / heads = 32, which vLLM's attention accepts."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def new_model(
    tokenizer: PreTrainedTokenizerFast, hidden: int, layers: int, heads: int, seed: int
) -> LlamaForCausalLM:
    """An untrained model over `tokenizer`, its weights drawn from torch's global generator seeded `seed`."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(tokenizer), hidden=hidden, layers=layers, heads=heads))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """A folder that `AutoModelForCausalLM.from_pretrained` / `PreTrainedTokenizerFast.from_pretrained` load."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def tiny_random_model(out_dir: str | Path, seed: int = 0) -> Path:
    """A seconds-sized untrained model (hidden 64, 2 layers, 2 heads of 32) for tests of other areas."""
    out = Path(out_dir)
    tokenizer = build_char_tokenizer()
    save_model(new_model(tokenizer, hidden=64, layers=2, heads=2, seed=seed), tokenizer, out)
    return out
