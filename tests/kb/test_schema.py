"""eaglekb.kb.schema: the Baseline model, metric units, better directions, parsing, the JSON Schema."""

import json

import pytest

from eaglekb.io.errors import SchemaError
from eaglekb.kb import baselines, schema


def doc(**overrides):
    """A minimal valid baseline document (no provenance capture, no files)."""
    data = {
        "schema_version": 1, "kind": "bench", "name": "demo", "created_at": "2025-01-01T00:00:00Z",
        "source": "measured",
        "provenance": {"command": "invoke bench", "git_commit": None, "git_dirty": None, "host": {},
                       "versions": {"python": "3.11"}},
        "config": {"steps": 2},
        "metrics": {"spec_tok_s": 100.0, "cycle": {"verify_ms": 12.5}},
        "noise": {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.05},
    }
    data.update(overrides)
    return data


def test_direction_from_unit_and_override():
    b = schema.Baseline.model_validate(doc(better={"cycle.verify_ms": "none"}))
    assert schema.direction(b, "spec_tok_s") == "higher"
    assert schema.direction(b, "cycle.verify_ms") == "none"


@pytest.mark.parametrize("path, expected", [
    ("val.acc.step0_pct", "higher"), ("online.accept_len", "higher"), ("breakeven_len", "lower"),
    ("targets.t150.required_len", "none"), ("mapping.source_mass_lost_pct", "lower"),
    ("coverage.a_counts.b_pct", "higher"), ("online.exact_match_frac", "higher"),
    ("position_match_pct", "none"), ("throughput.train_s", "lower"),
])
def test_direction_from_name_rules(path, expected):
    assert schema.direction(schema.Baseline.model_validate(doc()), path) == expected


@pytest.mark.parametrize("name, unit", [
    ("spec_tok_s", "_tok_s"), ("train_s", "_s"), ("accept_len", "_len"), ("_s", None), ("speed", None),
])
def test_unit_is_the_longest_suffix(name, unit):
    assert schema.unit_of(name) == unit


@pytest.mark.parametrize("text, fragment", [
    ("[1, 2]", "not a JSON object"),
    ('{"kind": ', "not valid JSON"),
    (json.dumps(doc(metrics={"speed": 1.0})), "unit"),
])
def test_parse_errors_are_one_line(text, fragment):
    with pytest.raises(SchemaError) as exc:
        schema.parse(text, "baselines/bench/demo.json")
    line = exc.value.line()
    assert "\n" not in line and fragment in line and "baselines/bench/demo.json" in line


def test_json_schema_exports():
    exported = schema.json_schema()
    assert exported["title"] == "Baseline" and "provenance" in exported["properties"]
    assert exported["additionalProperties"] is False


def test_writer_reexports_the_schema():
    """Callers need one import: ``baselines.Baseline`` and friends are the schema's own objects."""
    for name in ("Baseline", "Noise", "Citation", "KINDS", "UNITS", "NAME_RULES", "SCHEMA_VERSION",
                 "direction", "unit_of", "json_schema", "parse"):
        assert getattr(baselines, name) is getattr(schema, name), name
