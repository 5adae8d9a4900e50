"""The command line is thin: what the commands used to compute themselves is in the library, where a
notebook can call it, and every choice flag reads its choices and help from a registry.

- the retrieval command's ablation check and copy-distance profile (:mod:`interp.retrieval.check`);
- the checkpoint sweep's summary (:meth:`CheckpointScores.summary`);
- the prompts of ``interp roles`` read and checked by :mod:`interp.probes.prompts`, naming ``prompts=``;
- ``--method``, ``--probe``, ``--per`` (ablate), ``--probe`` (sinks) and ``--haystack`` (retrieval) from registries.
"""

import argparse

import pandas as pd
import pytest
import torch

from interp.ablation import GATE_UNITS, METHODS, exact_sweep, gradient_importance, pruning_curves, train_gates
from interp.cli.ablate import build_parser as ablate_parser
from interp.cli.common import in_flags
from interp.cli.retrieval import build_parser as retrieval_parser
from interp.cli.roles import build_parser as roles_parser
from interp.cli.sinks import build_parser as sinks_parser
from interp.config import RunConfig
from interp.errors import UsageError
from interp.probes import PROBES, random_tokens, repeated_tokens, text_probe
from interp.probes.needle import HAYSTACKS, needle_probe
from interp.probes.prompts import check_prompt_rows, prompt_ids
from interp.registry import Registry
from interp.retrieval import check as retrieval_check
from interp.retrieval import retrieval_scores
from interp.retrieval.check import distance_leaders, window_check
from interp.toy.planted import planted_model
from tests.helpers import one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return parser._option_string_actions[flag]


# ---- choices from registries ------------------------------------------------------------------


def test_a_registrys_help_can_name_a_subset_in_the_order_given():
    names = Registry("thing")
    names.add("a", "the first")
    names.add("b", "the second")
    names.add("c")
    assert names.help() == "a: the first; b: the second; c"
    assert names.help(only=["c", "a"]) == "c; a: the first"
    with pytest.raises(UsageError, match=r"unknown thing 'z': choose from \['a', 'b', 'c'\]"):
        names.help(only=["z"])


def test_the_choice_flags_read_their_registries():
    ablate = ablate_parser()
    assert METHODS.names() == ("exact", "gradient", "prune", "gates")
    assert [METHODS.get(m) for m in METHODS] == [exact_sweep, gradient_importance, pruning_curves, train_gates]
    method = _action(ablate, "--method")
    assert tuple(method.choices) == METHODS.names() and method.help == "what to compute: " + METHODS.help()
    assert tuple(_action(ablate, "--probe").choices) == ("repeated", "text")
    assert tuple(_action(ablate, "--per").choices) == GATE_UNITS.names()
    assert GATE_UNITS.help() in _action(ablate, "--per").help
    assert [PROBES.get(p) for p in PROBES] == [random_tokens, repeated_tokens, text_probe]
    probe = _action(sinks_parser(), "--probe")
    assert tuple(probe.choices) == ("random", "text")
    assert probe.help.startswith(PROBES.help(only=("random", "text")))
    haystack = _action(retrieval_parser(), "--haystack")
    assert tuple(haystack.choices) == HAYSTACKS.names() == ("random", "text")
    assert haystack.help == "haystack tokens: " + HAYSTACKS.help()


def test_the_needle_probe_takes_the_haystacks_registered_names():
    model = planted_model(128)
    by_none = needle_probe(model, seq_len=96, batch=2, seed=3)
    by_name = needle_probe(model, seq_len=96, batch=2, seed=3, haystack="random")
    assert torch.equal(by_none.tokens, by_name.tokens) and by_name.meta["haystack"] == "random"
    with pytest.raises(UsageError, match=r"haystack must be None, 'random', 'text' or token ids, got 'noise'"):
        needle_probe(model, seq_len=96, batch=2, haystack="noise")


# ---- the retrieval command's check and profile, in the library -----------------------------------


@pytest.fixture(scope="module")
def planted():
    model = planted_model(600)
    probe = needle_probe(model, seq_len=512, batch=2, seed=0)
    scores = retrieval_scores(model, probe, window=32)
    return model, probe, scores


def test_the_window_check_breaks_the_copy_only_for_the_retrieval_heads(planted):
    model, probe, scores = planted
    check = window_check(model, probe, scores.table, sink=4, window=32, config=scores_config())
    assert list(check) == ["clean", "sink", "window", "streaming", "retrieval"]
    assert check["sink"] == 4 and check["window"] == 32 and check["clean"] < 1e-3
    assert check["streaming"] == {"heads": ["0.0", "0.1"], "loss": pytest.approx(check["clean"], abs=1e-4)}
    assert check["retrieval"]["heads"] == ["1.0"] and check["retrieval"]["loss"] > 2.0


def test_the_window_check_is_skipped_past_the_pattern_budget(planted, monkeypatch):
    model, probe, scores = planted
    monkeypatch.setattr(retrieval_check, "PATTERN_BUDGET", 1000)
    check = window_check(model, probe, scores.table, sink=4, window=32, config=scores_config())
    assert list(check) == ["skipped"]
    assert check["skipped"].startswith("stream (") and "over the 0.000954 MiB budget" in check["skipped"]


def test_distance_leaders_are_the_heads_with_the_most_mean_induction_mass():
    rows = [(0, 0, 16, 0.1), (0, 0, 64, 0.3), (0, 1, 16, 0.9), (0, 1, 64, 0.7), (1, 0, 16, 0.5), (1, 0, 64, 0.0)]
    table = pd.DataFrame(rows, columns=["layer", "head", "distance", "induction"])
    wide = distance_leaders(table, 2)
    assert list(wide.index) == ["0.1", "1.0"] and list(wide.columns) == [16, 64]  # means 0.8, 0.25 (0.0: 0.2)
    assert wide.loc["0.1", 64] == 0.7 and wide.loc["1.0", 16] == 0.5


def scores_config() -> RunConfig:
    return RunConfig(progress=False)


# ---- the prompts of interp roles -------------------------------------------------------------------


def test_prompt_rows_are_checked_without_a_model_naming_the_parameter():
    with pytest.raises(UsageError) as bad:
        check_prompt_rows([{"prompt": "a b", "tokens": [1, 2], "answer": 3}])
    assert str(bad.value) == 'prompts=: prompt 0 needs "answer" and one of "prompt" (text) or "tokens" (ids)'
    assert bad.value.params == ("prompts",)
    assert in_flags(roles_parser(), bad.value) == (
        '--prompts: prompt 0 needs "answer" and one of "prompt" (text) or "tokens" (ids)'
    )
    with pytest.raises(UsageError, match=r"^prompts= must hold a non-empty list of objects, one per prompt$"):
        check_prompt_rows([])
    check_prompt_rows([{"text": "abc"}, {"tokens": [1, 2], "answer": 3}])  # both shapes pass


def test_prompt_ids_read_token_ids_and_name_the_parameter():
    model = planted_model(128)
    tokens, answers, wrongs = prompt_ids(model, [{"tokens": [0, 7, 9], "answer": 9, "wrong": 11}])
    assert (tokens, answers, wrongs) == ([[0, 7, 9]], [9], [11])
    with pytest.raises(UsageError) as mixed:
        prompt_ids(model, [{"tokens": [0, 7], "answer": 9, "wrong": 1}, {"tokens": [0, 5], "answer": 6}])
    assert in_flags(roles_parser(), mixed.value) == '--prompts: give "wrong" for every prompt or for none'
