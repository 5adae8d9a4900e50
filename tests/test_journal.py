"""interp.journal: finished units survive a kill, come back bit for bit, and only to the same run."""

from __future__ import annotations

import argparse
import math
import random
import struct

import pytest
import torch

from interp._io import writes_skipped
from interp.errors import UsageError
from interp.journal import Journal, fingerprint, model_identity, run_arguments, tokens_hash
from tests.helpers import gpt2_model

ARGS = argparse.Namespace(batch=10, seq_len=50, seed=0, out="x", top=10, no_progress=True, resume=False)


def _fp(**changes):
    args = argparse.Namespace(**{**vars(ARGS), **changes})
    return fingerprint(run_arguments(args), "model-a", "probe-a")


def test_resume_returns_the_done_units(tmp_path):
    j = Journal(tmp_path, "exact", _fp())
    assert j.open() == {}
    j.append((0, 1), {"delta": 0.25})
    j.append((1, 0), {"delta": -1.5})
    j.close()
    again = Journal(tmp_path, "exact", _fp(out="elsewhere", top=3))  # where to write is not a result
    assert again.open(resume=True) == {(0, 1): {"delta": 0.25}, (1, 0): {"delta": -1.5}}
    again.append((1, 1), {"delta": 2.0})
    again.close()
    assert Journal(tmp_path, "exact", _fp()).open(resume=True)[(1, 1)] == {"delta": 2.0}


def test_floats_round_trip_exactly(tmp_path):
    rng = random.Random(0)
    values = [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(2000)]
    values = [v for v in values if v == v]  # NaNs with payload bits: JSON keeps them NaN, not their bits
    values += [0.1, 1 / 3, -0.0, 5e-324, 1.7976931348623157e308, math.inf, -math.inf, math.nan]
    values += [float(x) for x in torch.randn(100, dtype=torch.float32)]  # float32 results, as the sweeps give
    j = Journal(tmp_path, "prune", _fp())
    j.open()
    j.append("step-0", values)
    j.close()
    back = Journal(tmp_path, "prune", _fp()).open(resume=True)["step-0"]
    assert [struct.pack("d", v) for v in back] == [struct.pack("d", v) for v in values]


def test_a_torn_last_line_is_dropped_and_cut_off(tmp_path):
    j = Journal(tmp_path, "gates", _fp())
    j.open()
    j.append(0.01, {"kept": 40})
    j.append(0.03, {"kept": 31})
    j.close()
    whole = j.path.read_bytes()
    j.path.write_bytes(whole[:-7])  # a kill -9 in the middle of the second unit's line
    k = Journal(tmp_path, "gates", _fp())
    assert k.open(resume=True) == {0.01: {"kept": 40}}
    k.append(0.03, {"kept": 31})
    k.close()
    assert j.path.read_bytes() == whole  # the torn bytes were cut before the append
    bad = bytearray(whole)
    bad[-5] ^= 1  # a complete line whose checksum fails
    j.path.write_bytes(bytes(bad))
    assert Journal(tmp_path, "gates", _fp()).open(resume=True) == {0.01: {"kept": 40}}


def test_a_torn_header_is_no_journal(tmp_path):
    j = Journal(tmp_path, "exact", _fp())
    j.open()
    header = j.path.read_bytes()
    j.close()
    assert not j.path.parent.exists()  # a journal of no finished unit is not kept
    j.path.parent.mkdir()
    j.path.write_bytes(header[:20])
    assert Journal(tmp_path, "exact", _fp()).open() == {}  # nothing was done: start, no refusal


def test_another_run_s_journal_is_refused_saying_what_differs(tmp_path):
    j = Journal(tmp_path, "exact", _fp())
    j.open()
    j.append((0, 0), 1.0)
    j.close()
    path = tmp_path / ".journal" / "exact.jsonl"
    with pytest.raises(UsageError) as e:
        Journal(tmp_path, "exact", _fp(batch=4)).open(resume=True)
    assert str(e.value) == (
        f"{path} belongs to another run: the arguments differ (--batch 10 then, 4 now). Cannot resume it: "
        "use another --out, or delete the journal (or pass --fresh) to start over"
    )
    other = fingerprint(run_arguments(ARGS), "model-b", "probe-b")
    with pytest.raises(UsageError) as e:
        Journal(tmp_path, "exact", other).open()
    assert str(e.value) == (
        f"{path} belongs to another run: the model differs (another name, shape or weights); the probe's "
        "tokens differ. use another --out, or delete the journal (or pass --fresh) to start over"
    )
    with pytest.raises(UsageError) as e:
        Journal(tmp_path, "exact", _fp()).open()
    assert str(e.value) == (
        f"{path} holds 1 finished unit(s) of an unfinished run with the same arguments, model and probe: "
        "pass --resume to continue it, or --fresh to start over"
    )
    assert Journal(tmp_path, "exact", _fp(batch=4)).open(fresh=True) == {}


def test_finish_leaves_no_journal_and_other_ranks_write_nothing(tmp_path):
    j = Journal(tmp_path, "exact", _fp())
    j.open()
    j.append((0, 0), 1.0)
    j.finish()
    assert not (tmp_path / ".journal").exists()
    with writes_skipped():
        k = Journal(tmp_path / "rank1", "exact", _fp())
        assert k.open() == {}
        k.append((0, 0), 1.0)
        assert k.done() == {(0, 0): 1.0}
    assert not (tmp_path / "rank1").exists()


def test_fingerprint_parts_see_weights_shapes_and_tokens():
    a, b = gpt2_model(seed=0), gpt2_model(seed=0)
    assert model_identity(a, "m") == model_identity(b, "m") != model_identity(a, "n")
    with torch.no_grad():
        b.transformer.h[1].attn.c_attn.weight[0, 0] += 1e-3  # one weight of one tensor
    assert model_identity(a, "m") != model_identity(b, "m")
    assert model_identity(gpt2_model(n_layer=3), "m") != model_identity(a, "m")
    t = torch.arange(12).reshape(3, 4)
    assert tokens_hash(t) == tokens_hash(t.clone()) != tokens_hash(t.reshape(4, 3))
    assert tokens_hash(t) != tokens_hash(t.flip(1))
