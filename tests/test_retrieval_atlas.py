"""The atlas's retrieval part: on the planted model it names the planted heads and draws the curves;
on the bundled toy (context 256) it is left out unasked, with a note, and runs when asked."""

from __future__ import annotations

import pytest

from interp.config import RunConfig
from interp.models import load_model
from interp.report import head_atlas
from interp.report.build import atlas_sizes
from interp.toy.planted import planted_model
from tests.helpers import one_thread

FAST = [
    "exact",
    "gradient",
    "pruning",
    "patterns",
    "ov",
    "encoder",
    "composition",
    "cards",
]  # + what heads write and read


@pytest.fixture(scope="module")
def planted_atlas():
    with one_thread():
        return head_atlas(
            planted_model(1100), skip=FAST, sizes=atlas_sizes(batch=2, seq_len=20), config=RunConfig(seed=0)
        )


def test_planted_heads_in_the_role_table_and_the_page(planted_atlas, tmp_path):
    roles = planted_atlas.roles.set_index("label")
    assert roles.loc["1.0", "retrieval"] == 1.0 and roles.loc["1.0", "retrieval_role"] == "retrieval"
    assert roles.loc["0.1", "retrieval_role"] == "streaming" and roles.loc["0.1", "streaming"] > 0.999
    assert (roles.drop(index=["1.0"])["retrieval"] == 0).all()
    assert set(roles.drop(index=["0.0", "0.1", "1.0"])["retrieval_role"]) == {"neither"}
    assert planted_atlas.retrieval["meta"]["seq_len"] == 1 + 1024  # BOS + the body
    dist = planted_atlas.retrieval["distance"]
    assert sorted(dist["distance"].unique()) == [16, 64, 256]  # the powers of 4 that fit 1024 tokens
    page = planted_atlas.save(tmp_path)[0].read_text()
    assert '<section id="retrieval"><h2>Retrieval and streaming heads</h2>' in page
    assert 'id="atlas-copy-distance"' in page and 'id="atlas-retrieval"' in page
    assert "<th>streaming (sink + window)</th>" in page  # the role table's columns


def test_toy_leaves_it_out_unasked_and_runs_it_when_asked(tmp_path):
    toy = load_model("toy", device="cpu")
    with one_thread():
        atlas = head_atlas(toy, skip=[*FAST, "sinks"], sizes=atlas_sizes(batch=2, seq_len=20), config=RunConfig(seed=0))
        assert atlas.retrieval is None and "retrieval" not in atlas.roles
        assert atlas.meta["notes"] == [
            "retrieval: left out: the model's context holds 255 tokens, fewer than the 512 the atlas needs to run "
            "its needle probe unasked; ask for a shorter one with retrieval_len= (command line: --retrieval-len)"
        ]
        page = atlas.save(tmp_path / "a")[0].read_text()
        assert "retrieval: left out" in page
        asked = head_atlas(
            toy,
            skip=[*FAST, "sinks"],
            sizes=atlas_sizes(batch=2, seq_len=20, retrieval_len=200),
            config=RunConfig(seed=0),
        )
    assert asked.retrieval["meta"]["seq_len"] == 1 + 200 and "retrieval_role" in asked.roles
    skipped = head_atlas(
        toy,
        skip=[*FAST, "sinks", "retrieval"],
        sizes=atlas_sizes(batch=2, seq_len=20, retrieval_len=200),
        config=RunConfig(seed=0),
    )
    assert skipped.retrieval is None and "notes" not in skipped.meta
