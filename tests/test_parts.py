"""The registry of analysis parts: sizes with the atlas's defaults, typed reasons, checked sizes."""

from __future__ import annotations

import dataclasses
import re

import pytest

from interp.config import RunConfig
from interp.errors import UsageError
from interp.models import describe, load_model
from interp.parts import PARTS, Given, NotApplicable, fingerprint
from interp.parts.attention import ScoreSizes
from interp.parts.roles import OVSizes
from interp.report.build import atlas_work, head_atlas


@pytest.fixture(scope="module")
def toy():
    return load_model("toy", device="cpu")


def test_each_part_is_its_sizes_and_work_and_the_atlas_plan_is_theirs(toy):
    info = describe(toy)
    plan = atlas_work(info)
    for name in plan:
        p = PARTS.get(name)
        sizes = p.sizes()
        with pytest.raises(dataclasses.FrozenInstanceError):
            sizes.__setattr__(dataclasses.fields(sizes)[0].name, None)
        assert fingerprint(sizes) == dataclasses.asdict(sizes)
        assert p.work(info, sizes) == plan[name]
    assert "retrieval" not in plan and "task" not in plan  # the toy's context is short; no task given


def test_the_ov_part_says_why_the_successor_score_is_left_out_without_reading_an_error(toy):
    got = PARTS.get("ov").run(toy, OVSizes(), RunConfig(n_boot=10), Given())
    assert got.left_out == {
        "successor": NotApplicable(
            "the successor score needs ordinal sequences of tokens, and toy has no tokenizer",
            "pass sequences={name: [token ids in order]}",
            ("sequences",),
        )
    }
    assert list(got.columns.columns[:3]) == ["layer", "head", "label"] and "copy_suppression" in got.columns


def test_sizes_name_a_part_and_are_its_type(toy):
    with pytest.raises(UsageError, match=re.escape("sizes= names no part nope: choose from scores, sinks")):
        head_atlas(toy, sizes={"nope": ScoreSizes()})
    with pytest.raises(UsageError) as e:
        head_atlas(toy, sizes={"sinks": ScoreSizes()})
    assert str(e.value) == "sizes={'sinks': ...} must be a SinkSizes, got ScoreSizes" and e.value.params == ("sizes",)
