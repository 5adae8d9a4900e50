"""What a task and a user's prompts are made of: no second BOS anywhere (one shared warning), the
toy reads text as its UTF-8 bytes, several answer texts per pair, the first n pairs of a task file,
and a path no sender can reach refused before any forward."""

from __future__ import annotations

import warnings

import pytest

from interp import TokenProbe
from interp.errors import UsageError
from interp.models import load_model
from interp.patching import path_patch
from interp.probes.task import TaskProbe, read_task, task_probe

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TASK_NOTE = "it is not added again; pass framed=True if the prompts carry all of the model's framing"


@pytest.fixture(scope="module")
def toy():
    return load_model("toy", device="cpu")


def _byte(c: str) -> int:
    """The toy's id of a one-byte character: its ordinary ids are 1..511 (0 is its BOS), byte b the b-th."""
    return ord(c) + 1


def test_a_prompt_that_starts_with_the_bos_text_gets_no_second_one(gpt2_tiny):
    clean, corrupted = ["<|endoftext|> w1 w2", "w1 w2"], ["<|endoftext|> w5 w2", "w5 w2"]
    with pytest.warns(UserWarning) as seen:
        task = TaskProbe.from_pairs(gpt2_tiny, clean, corrupted, ["w3", "w3"], ["w6", "w6"])
    assert task.clean.tolist() == [[0, 1, 2], [0, 1, 2]] and task.corrupted.tolist() == [[0, 5, 2], [0, 5, 2]]
    assert [str(w.message) for w in seen] == [f"2 of 4 prompts already start with the model's BOS: {TASK_NOTE}"]


def test_an_id_file_on_the_toy_gets_no_second_bos_and_framed_takes_it_as_it_is(toy, tmp_path):
    f = tmp_path / "ids.jsonl"
    f.write_text('{"clean": [0, 5, 6, 7], "corrupted": [0, 8, 6, 7], "answer": 5, "wrong": 8}\n')
    with pytest.warns(UserWarning) as seen:
        task = read_task(toy, f)
    assert task.clean.tolist() == [[0, 5, 6, 7]] and task.seq_len == 4
    assert [str(w.message) for w in seen] == [f"every prompt already starts with the model's BOS: {TASK_NOTE}"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        framed = task_probe(toy, f, framed=True)
    assert framed.clean.tolist() == [[0, 5, 6, 7]]
    with pytest.raises(UsageError) as e:
        task_probe(toy, "repeat", framed=True)
    assert str(e.value) == "framed applies to a task file: the bundled task 'repeat' frames its own prompts"


def test_ids_and_texts_that_start_with_the_bos_get_no_second_one(toy, gpt2_tiny):
    with pytest.warns(UserWarning) as seen:
        probe = TokenProbe.from_tokens(toy, [[0, 5, 6], [0, 7, 8]])
    assert probe.tokens.tolist() == [[0, 5, 6], [0, 7, 8]] and probe.body_start == 1
    assert [str(w.message) for w in seen] == [
        "every sequence already starts with the model's BOS: it is not added again; pass framed=True if the ids "
        "carry all of the model's framing"
    ]
    with pytest.warns(UserWarning) as seen:
        probe = TokenProbe.from_texts(gpt2_tiny, ["<|endoftext|> w1 w2 w3", "w1 w4 w3"])
    assert probe.tokens.tolist() == [[0, 1, 2, 3], [0, 1, 4, 3]]
    assert [str(w.message) for w in seen] == ["1 of 2 texts already start with the model's BOS: it is not added again"]


def test_the_toy_reads_a_text_task_file_as_its_utf8_bytes(toy, tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("clean,corrupted,answer,wrong\nab a,cb a,b,c\n")
    task = read_task(toy, f)
    assert task.clean.tolist() == [[0, *map(_byte, "ab a")]] and task.corrupted.tolist() == [[0, *map(_byte, "cb a")]]
    assert task.answer.tolist() == [[_byte("b")]] and task.wrong.tolist() == [[_byte("c")]]
    with pytest.raises(UsageError) as e:
        TaskProbe.from_pairs(toy, ["ab"], ["cb"], ["\u00e9"], ["c"])
    assert str(e.value) == (
        "pair 0: the answer '\u00e9' is 2 tokens, not one: a model without a tokenizer reads a text as its UTF-8 "
        "bytes, one token a byte; choose a one-byte (ASCII) answer"
    )


def test_several_answer_texts_per_pair_as_a_list_or_a_cell(gpt2_tiny):
    listed = TaskProbe.from_pairs(gpt2_tiny, ["w1 w2"], ["w5 w2"], [["w3", "w4"]], [["w6", 7]])
    cell = TaskProbe.from_pairs(gpt2_tiny, ["w1 w2"], ["w5 w2"], ["w3|w4"], ["w6|w7"])
    assert listed.answer.tolist() == cell.answer.tolist() == [[3, 4]]
    assert listed.wrong.tolist() == cell.wrong.tolist() == [[6, 7]]
    with pytest.raises(UsageError) as e:
        TaskProbe.from_pairs(gpt2_tiny, ["w1 w2"], ["w5 w2"], [["w3", "w3 w4"]], ["w6"])
    assert str(e.value).startswith("pair 0: the answer 'w3 w4' is 2 tokens, not one: the tokenizer splits it as")


def test_a_task_file_gives_its_first_n_pairs(toy, tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        "".join(f'{{"clean": [{i}, 2, 3], "corrupted": [9, 2, 3], "answer": 5, "wrong": 6}}\n' for i in (1, 4, 7))
    )
    every, first = task_probe(toy, f), task_probe(toy, f, n_pairs=2)
    assert every.n_pairs == 3 and first.clean.tolist() == every.clean[:2].tolist()
    assert first.meta["file_pairs"] == 3
    with pytest.raises(UsageError) as e:
        task_probe(toy, f, n_pairs=4)
    assert str(e.value) == (
        f"{f} holds 3 pairs, fewer than the 4 asked for (n_pairs): ask for at most 3, or leave n_pairs out to use "
        "every pair"
    )


def test_a_receiver_no_sender_can_reach_is_refused_before_any_forward(toy):
    # clean == corrupted would be refused by the baselines' forwards: the receiver's refusal comes first
    same = TaskProbe.from_pairs(toy, [[1, 2, 3]], [[1, 2, 3]], [5], [6])
    with pytest.raises(UsageError) as e:
        path_patch(toy, same, receivers="0.1,1.2")
    assert str(e.value) == (
        "receivers=0.1,1.2: receiver 0.1 is in layer 0, and no sender is in an earlier layer: no path reaches it; "
        "choose receivers in layer 1 or later, or receivers=logits"
    )


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl"])
def test_a_task_file_saved_with_a_byte_order_mark_reads_as_without(toy, tmp_path, name):
    """A spreadsheet's "CSV UTF-8" starts with a BOM; read as text it glued itself to the first
    column's name, and the file was refused as lacking ``clean``."""
    body = {
        "t.csv": "clean,corrupted,answer,wrong\nab a,cb a,b,c\n",
        "t.jsonl": '{"clean": "ab a", "corrupted": "cb a", "answer": "b", "wrong": "c"}\n',
    }[name]
    plain, marked = tmp_path / name, tmp_path / f"bom_{name}"
    plain.write_text(body, encoding="utf-8")
    marked.write_text(body, encoding="utf-8-sig")
    assert marked.read_bytes()[:3] == b"\xef\xbb\xbf"
    want, got = read_task(toy, plain), read_task(toy, marked)
    for side in ("clean", "corrupted", "answer", "wrong"):
        assert getattr(got, side).tolist() == getattr(want, side).tolist()


def test_an_answer_equal_to_its_wrong_answer_is_refused(toy, tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("clean,corrupted,answer,wrong\nab a,cb a,b,c\nab a,cb a,b,b\nab c,cb c,b,b\n")
    with pytest.raises(UsageError) as e:
        read_task(toy, f)
    assert str(e.value) == (
        f"pair 1: the answer 'b' and the wrong answer 'b' share token id {_byte('b')}: the logit difference would "
        "cancel it, whatever the model does; give a wrong answer other than the answer (2 pairs of 3 like this)"
    )
    with pytest.raises(UsageError, match=r"^pair 0: the answer \['b', 'c'\] and the wrong answer 'c' share token id"):
        TaskProbe.from_pairs(toy, ["ab"], ["cb"], [["b", "c"]], ["c"])


def test_a_one_pair_task_is_one_pair_in_what_is_printed(toy, tmp_path):
    from interp.roles.qk import qk_source

    f = tmp_path / "t.csv"
    f.write_text("clean,corrupted,answer,wrong\nab a,cb a,b,c\n")
    _, at, said = qk_source(toy, at="task", task=str(f), batch=1)
    assert at == "task" and said == "the t task (1 pair), read at position 4"
