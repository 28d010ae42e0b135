from pathlib import Path

import pytest

from graphshard.config import Config, ConfigError, default_buckets

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_presets_load(path):
    cfg = Config.from_toml(path)
    assert cfg.buckets[-1] <= cfg.max_num_reqs


def test_presets_cover_real_vocabularies():
    vocabs = {Config.from_toml(p).vocab_size for p in CONFIGS}
    assert {128256, 152064} <= vocabs


def test_default_buckets_follow_the_rule():
    b = default_buckets(1024)
    assert b[:5] == (1, 2, 4, 8, 16)
    assert 248 in b and 256 in b and 272 in b and 512 in b and 544 in b and b[-1] == 1024
    assert all(x < y for x, y in zip(b, b[1:]))
    assert default_buckets(100)[-1] == 100


@pytest.mark.parametrize("field, value, message", [
    ("vocab_size", 0, "vocab_size' = 0: must be >= 2"),
    ("logits_dtype", "int8", "logits_dtype' = 'int8': must be one of"),
    ("transport", "mpi", "transport' = 'mpi'"),
    ("graph_backend", "xla", "graph_backend"),
    ("strategy", "split", "strategy"),
    ("fallback", "skip", "fallback"),
    ("max_num_slots", 2, "must be >= max_num_reqs"),
    ("buckets", [4, 2], "strictly increasing"),
    ("buckets", [1, 64], "exceeds max_num_reqs"),
    ("buckets", [], "at least one"),
    ("max_num_logits_per_req", 1.5, "must be an integer"),
    ("num_logprobs", -1, "must be >= 0"),
    ("grammar_bitmask", "no", "grammar_bitmask' = 'no': must be true or false"),
    ("grammar_bitmask", 0, "grammar_bitmask' = 0: must be true or false"),
    ("bitmask_free_graphs", 1, "bitmask_free_graphs' = 1: must be true or false"),
    ("programmatic_launch", "yes", "programmatic_launch' = 'yes': must be true or false"),
])
def test_bad_fields_name_field_and_value(field, value, message):
    with pytest.raises(ConfigError, match=message):
        Config(**{"vocab_size": 100, "max_num_reqs": 8, field: value})


def test_config_is_frozen():
    cfg = Config(vocab_size=100, max_num_reqs=8)
    with pytest.raises(Exception):
        cfg.vocab_size = 5
    assert cfg.max_num_slots == 8 and cfg.buckets == (1, 2, 4, 8)
    assert cfg.padded_vocab_size(2) == 128


def test_toml_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine]\nvocab_size = 100\nmax_num_reqs = 8\nwhat = 1\n")
    with pytest.raises(ConfigError, match="unknown config field"):
        Config.from_toml(bad)
    bad.write_text("[engine]\nvocab_size = 100\n")
    with pytest.raises(ConfigError, match="missing required.*max_num_reqs"):
        Config.from_toml(bad)
    bad.write_text("vocab_size = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.from_toml(bad)
    bad.write_text("[engine]\nvocab_size = 100\nmax_num_reqs = 64\nbuckets = \"default\"\nmax_bucket = 32\n")
    assert Config.from_toml(bad).buckets[-1] == 32
    with pytest.raises(ConfigError, match="not found"):
        Config.from_toml(tmp_path / "none.toml")
