"""`omni-autoconf models` counts, per pipeline, how each memory term is known (issue 19): measured
(a start-up log), derived (config, tensor sizes, code) or estimated (its source says so)."""

from __future__ import annotations

import re

from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.inputs.catalog import lookup_model, model_catalog
from omni_autoconf.inputs.catalog_provenance import classify, provenance, term_sources


def test_a_source_is_classified_by_what_it_says_and_what_it_cites():
    sources = {"calib": "public start-up logs: talker Model loading took 8.49 GiB", "facts": "safetensors headers"}
    assert classify("calib: the logged load", sources) == "measured"
    assert classify("facts: talker 3.32 B", sources) == "derived"
    assert classify("estimate: the 7B talker layout", sources) == "estimated"
    assert classify("facts: the 3B is assumed to share the 7B's encoders", sources) == "estimated"
    # where the figure comes from is the first clause: a config checked against a log is derived
    assert classify("config.json talker_config; agrees with the logged 65,536 tokens", sources) == "derived"
    assert classify("gpu_model_runner.py sizes it and logs it", {}) == "derived"
    assert classify("the logged 3.8655 GiB less the blocks above", {}) == "measured"


def test_the_calibrated_qwen3_tts_talker_counts_a_measured_term():
    spec = lookup_model("qwen3-tts-1.7b")
    assert provenance(spec)["measured"] >= 1
    assert provenance(lookup_model("qwen2.5-omni-3b"))["measured"] == 0


def test_every_term_of_every_pipeline_is_counted_once():
    for spec in model_catalog().values():
        counts = provenance(spec)
        assert sum(counts.values()) == len(term_sources(spec)) > 0, spec.name


def test_the_unconfirmed_qwen2_5_omni_3b_talker_counts_as_estimated():
    spec = lookup_model("qwen2.5-omni-3b")
    talker = spec.stage("talker")
    assert classify(next(c.source for c in talker.components if c.name == "talker"), spec.sources) == "estimated"


def test_the_models_command_prints_the_counts_per_pipeline():
    out = CliRunner().invoke(main, ["models"]).stdout.splitlines()
    assert len(out) == len(model_catalog())
    for line in out:
        m = re.search(r"memory terms: (\d+) measured, (\d+) derived, (\d+) estimated$", line)
        assert m, line
        name = line.split()[0]
        assert tuple(map(int, m.groups())) == tuple(provenance(model_catalog()[name]).values())
