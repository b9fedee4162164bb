"""A tiny Qwen-style causal LM and tokenizer built entirely in code (no downloads).

Tests and examples need a model with the same shape as the real thing (ChatML turns,
`<tool_call>` blocks, a Jinja chat template) that trains in seconds on a CPU. The
tokenizer is a byte-level BPE trained on a small built-in corpus, so it encodes any
text (command output included) without unknown tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Qwen2.5's template, trimmed: tools in the system turn, `<tool_call>` JSON blocks in
# assistant turns, consecutive tool results grouped into one user turn. `arguments`
# may be a dict or (OpenAI style) an already-encoded JSON string.
QWEN_STYLE_CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}\
{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nYou may call one or more functions.\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nReturn each call as <tool_call>{"name": ..., "arguments": ...}</tool_call>\
<|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) \
or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}\
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}\
{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

# Enough shell, Python and chat text that common words become single tokens.
_CORPUS = [
    "You are a helpful assistant that fixes bugs in Python repositories.",
    "THOUGHT: I should look at the failing test first, then edit the source.",
    "```bash\nls -la\ncat src/calc.py\ngrep -rn 'def add' .\npython3 -m pytest -q tests\n```",
    "```bash\nsed -i 's/return a - b/return a + b/' calc.py\n```",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff > patch.txt && cat patch.txt",
    "def add(a, b):\n    return a + b\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    'Traceback (most recent call last):\n  File "calc.py", line 2\nAssertionError',
    "1 passed, 1 failed in 0.01s",
    "<returncode>0</returncode>\n<output>\nok\n</output>",
    '{"name": "bash", "arguments": {"command": "ls"}}',
    "The quick brown fox jumps over the lazy dog. 0123456789 ./-_:;,'\"()[]{}<>=+*&|%$#@!?~^`",
]


def build_tokenizer(vocab_size: int = 600) -> Any:
    """A `PreTrainedTokenizerFast` with ChatML specials and the Qwen-style chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast: Any = PreTrainedTokenizerFast  # untyped constructor
    tok = fast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tok.chat_template = QWEN_STYLE_CHAT_TEMPLATE
    return tok


def build_model(tokenizer: Any, *, hidden: int = 48, layers: int = 2, seed: int = 0) -> Any:
    """A randomly initialised `Qwen2ForCausalLM` small enough to train on a CPU in seconds."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny(path: Path, *, seed: int = 0) -> Path:
    """Write the tiny model and tokenizer to `path` (loadable with `from_pretrained`)."""
    tok = build_tokenizer()
    model = build_model(tok, seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path
