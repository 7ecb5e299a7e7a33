"""Tiny, fully offline building blocks for real TRL GRPO runs on CPU (tests, benchmarks, demos).

Nothing is downloaded: the tokenizer is a byte-level BPE trained in memory on a few lines, the model a
randomly initialised 2-layer Qwen2 with a hidden size of 32, the dataset a handful of chat prompts.

Tool calling works end to end with TRL's `tools=` (transformers >= 5.13 `response_template` parsing):

- the chat template is a compact, prefix-preserving Qwen-style template (TRL checks both properties);
- the tokenizer's `response_template` is TRL's Qwen3 one (`<tool_call>{json}</tool_call>`);
- a random model would never spell out a JSON tool call, so one *added token* carries a whole call,
  `<tool_call>\\n{"name": "search", "arguments": {"query": "paris"}}\\n</tool_call>`, and generation gets
  a `sequence_bias` that makes it likely (and makes `<|im_end|>` follow it). The bias only shapes
  sampling; training log-probs come from the unbiased model, exactly as with any off-policy sampler.

Every completion is then a mix of model tokens, tool-call tokens and masked tool-response tokens
(TRL's `tool_mask` == 0), i.e. several actions per trajectory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

TOOL_CALL_TEXT = '<tool_call>\n{"name": "search", "arguments": {"query": "paris"}}\n</tool_call>'
"""Content of the added token that spells one complete `search` tool call."""

ANSWER_TEXT = "<answer>paris</answer>"
"""Content of the optional added token (`build_tokenizer(answer_token=True)`) that spells a final answer."""

EXAMPLE_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "search_r1_grpo.py"

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\ntools:"
    "{%- for tool in tools %} {{ tool.function.name if tool.function is defined else tool.name }}{%- endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if message.content %}{{ message.content }}{% endif %}"
    "{%- for tc in message.tool_calls or [] %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    '<tool_call>\n{"name": "{{ f.name }}", "arguments": {{ f.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>tool\n{{ message.content }}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "what is the capital of france? paris is the capital of france.",
    "search the web for the answer, then answer in one word.",
    "who wrote hamlet? william shakespeare wrote hamlet.",
    "tools: search. the answer is paris. the answer is london.",
    '{"name": "search", "arguments": {"query": "capital"}}',
    "user assistant tool system 0123456789",
]

PROMPTS = [
    "what is the capital of france?",
    "who wrote hamlet?",
    "name a city in europe.",
    "what is two plus two?",
    "search for the tallest mountain.",
    "answer in one word: sky colour?",
    "which river flows through paris?",
    "what is the capital of england?",
]


def search(query: str) -> str:
    """Search a tiny offline index.

    Args:
        query: What to look up.

    Returns:
        The best matching snippet.
    """
    return "paris" if "paris" in query or "france" in query else "no result"


def hashed_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """A deterministic, varied reward: 1/3 steps of a hash of the completion, +1 if a tool was called.

    GRPO needs rewards that differ inside a group (else every advantage is 0); with a random model a
    hash of the text is as good a "task" as any.
    """
    out: list[float] = []
    for completion in completions:
        text = str(completion)
        digest = hashlib.sha256(text.encode()).digest()[0] % 4
        used_tool = (
            any(m.get("role") == "tool" for m in completion) if isinstance(completion, list) else False
        )
        out.append(digest / 3.0 + (1.0 if used_tool else 0.0))
    return out


def build_tokenizer(vocab_size: int = 320, *, answer_token: bool = False) -> Any:
    """Byte-level BPE trained in memory, wrapped in a `PreTrainedTokenizerFast` with a tool-capable template.

    `answer_token=True` adds one more token spelling `ANSWER_TEXT` (after the tool-call token), for
    runs that need `<answer>...</answer>` spans in the completions (see `generation_kwargs`).
    """
    added = [TOOL_CALL_TEXT, ANSWER_TEXT] if answer_token else [TOOL_CALL_TEXT]
    return _example().train_bpe_tokenizer(
        _CORPUS, vocab_size=vocab_size, chat_template=CHAT_TEMPLATE, added_tokens=added
    )


def tool_call_token_id(tokenizer: Any) -> int:
    token_id = tokenizer.convert_tokens_to_ids(TOOL_CALL_TEXT)
    assert isinstance(token_id, int)
    return token_id


def build_model(tokenizer: Any, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> Any:
    """Randomly initialised Qwen2 causal LM sized to `tokenizer` (float32, CPU): the example's recipe."""
    return _example().build_tiny_model(tokenizer, hidden=hidden, layers=layers, ffn_mult=2, seed=seed)


def _example() -> Any:
    """examples/search_r1_grpo.py as a module (examples are scripts, not a package)."""
    import importlib.util
    import sys

    name = "lldmon_example_search_r1_grpo"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE_SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def make_loadable(model: Any, path: str | Path) -> Any:
    """Save `model` to `path` and point its config there, so TRL can load a reference copy (beta > 0)."""
    model.save_pretrained(str(path))
    model.config._name_or_path = str(path)
    return model


def build_dataset(n: int = 8) -> Any:
    """Conversational prompt dataset (`prompt` column of chat messages)."""
    from datasets import Dataset

    prompts = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(n)]
    return Dataset.from_dict({"prompt": prompts})


def answer_token_id(tokenizer: Any) -> int:
    """Id of the `ANSWER_TEXT` token (`build_tokenizer(answer_token=True)`)."""
    token_id = tokenizer.convert_tokens_to_ids(ANSWER_TEXT)
    assert isinstance(token_id, int) and token_id != tokenizer.unk_token_id
    return token_id


def generation_kwargs(
    tokenizer: Any, *, tool_bias: float = 4.0, eos_bias: float = 2.5, answer_bias: float | None = None
) -> dict[str, Any]:
    """Sampling bias that makes the random model call the tool and stop after a few tokens.

    With `answer_bias` (tokenizer built with `answer_token=True`) the `ANSWER_TEXT` token gets that
    bias too and is likely followed by `<|im_end|>`, so completions end with an answer span.
    """
    call, eos = tool_call_token_id(tokenizer), tokenizer.eos_token_id
    bias: list[list[Any]] = [[[call], tool_bias], [[eos], eos_bias], [[call, eos], 30.0]]
    if answer_bias is not None:
        answer = answer_token_id(tokenizer)
        bias += [[[answer], answer_bias], [[answer, eos], 30.0]]
    return {"sequence_bias": bias}


def grpo_config(output_dir: str | Path, tokenizer: Any, **overrides: Any) -> Any:
    """A `GRPOConfig` for a few-second CPU run; `overrides` win.

    Defaults: 4 completions per prompt, micro-batches of 4, one micro-batch per optimizer step and
    two optimizer steps per rollout batch (`steps_per_generation=2`), so the second step of every
    rollout trains on log-probs that drifted (non-zero in-loss deltas).
    """
    from trl import GRPOConfig

    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,
        "num_generations": 4,
        "max_completion_length": 40,
        "max_tool_calling_iterations": 2,
        "max_steps": 4,
        "learning_rate": 5e-2,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "seed": 0,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "generation_kwargs": generation_kwargs(tokenizer),
    }
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)
