"""docs/catalog.md, the guide to writing a catalog entry: its field reference is generated from the
catalog's pydantic models (omni_autoconf.inputs.catalog_guide) and fails here while stale; every
field has a description; and what the guide says about `match` rules holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_autoconf.errors import CatalogError, InputError
from omni_autoconf.inputs.catalog import PipelineSpec, load_pipeline_text, model_catalog
from omni_autoconf.inputs.catalog_guide import COMMAND, END, START, catalog_models, main, with_reference
from omni_autoconf.inputs.catalog_match import MatchRule, check_rules, match_config

PAGE = Path(__file__).resolve().parent.parent / "docs" / "catalog.md"


def test_the_field_reference_in_docs_catalog_md_is_current():
    page = PAGE.read_text()
    assert page.count(START) == 1 and page.count(END) == 1, f"docs/catalog.md must hold one {START} ... {END}"
    assert with_reference(page) == page, f"docs/catalog.md's field reference is stale: run `{COMMAND}`"


def test_every_catalog_field_has_a_description():
    missing = [f"{model.__name__}.{name}" for model, _ in catalog_models(PipelineSpec)
               for name, field in model.model_fields.items() if not (field.description or "").strip()]
    assert not missing, f"fields without a description (the guide's reference prints them): {missing}"


def test_the_generator_prints_the_reference_and_refuses_a_page_without_its_markers(capsys):
    assert main([]) == 0 and "### PipelineSpec" in capsys.readouterr().out
    with pytest.raises(ValueError, match="fields:start"):
        with_reference("# a page\n")


@pytest.mark.parametrize("cfg, name", [
    ({"model_type": "qwen3_tts", "talker_config": {"hidden_size": 1024}}, "qwen3-tts-0.6b"),
    ({"model_type": "qwen3_tts", "talker_config": {"hidden_size": 2048}}, "qwen3-tts-1.7b"),  # the default
    ({"model_type": "qwen3_tts"}, "qwen3-tts-1.7b"),
    ({"model_type": "qwen3_omni_moe", "enable_audio_output": False}, "qwen3-omni-moe-thinking"),
    ({"model_type": "qwen3_omni_moe", "enable_audio_output": None}, "qwen3-omni-moe-thinking"),  # reads as false
    ({"model_type": "qwen3_omni_moe"}, "qwen3-omni-moe"),  # the condition's default: true
    ({"model_type": "qwen2_5_omni", "thinker_config": {"text_config": {"hidden_size": 2048}}}, "qwen2.5-omni-3b"),
    ({"model_type": "qwen2_5_omni", "thinker_config": {"hidden_size": 2048}}, "qwen2.5-omni-3b"),  # the second path
    ({"model_type": "qwen2_5_omni", "thinker_config": {"hidden_size": 3584}}, "qwen2.5-omni-7b"),
    ({"model_type": "qwen2", "architectures": ["MiMoAudioModel"]}, "mimo-audio-7b"),  # by architecture
    ({"model_type": "moss_tts_delay", "n_vq": 16}, None),  # named, but no rule holds
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, None),
])
def test_match_rules_pick_as_the_guide_says(cfg, name):
    found = match_config(model_catalog(), cfg, "DIR")
    assert (found.name if found else None) == name


def test_a_refusal_quotes_its_reason_and_points_to_the_catalog_name():
    found = match_config(model_catalog(), {"model_type": "glm_tts"}, "DIR")
    assert str(found.refusal("DIR")) == ("DIR: a glm_tts directory is not read yet (its weights sit in more than "
                                         "one folder); plan it by its catalog name: --model glm-tts")


def test_an_object_on_a_conditions_path_that_is_no_object_names_it():
    with pytest.raises(InputError, match="config.json: talker_config must be an object"):
        match_config(model_catalog(), {"model_type": "qwen3_tts", "talker_config": 5}, "DIR")


def test_rules_no_config_can_tell_apart_are_refused_and_two_that_hold_at_once_are_exit_2():
    class Entry:
        def __init__(self, *rules):
            self.match = [MatchRule.model_validate(r) for r in rules]

    default = {"model_type": "x"}
    with pytest.raises(CatalogError, match="the same conditions as in a"):
        check_rules({"a": Entry(default), "b": Entry(default)})
    one, two = ({"model_type": "x", "when": [{"key": k, "equals": 1}]} for k in ("p", "q"))
    check_rules({"a": Entry(one), "b": Entry(two)})
    with pytest.raises(InputError, match="matches more than one catalog pipeline \\(a, b\\)"):
        match_config({"a": Entry(one), "b": Entry(two)}, {"model_type": "x", "p": 1, "q": 1}, "DIR")


def test_a_variant_does_not_inherit_its_bases_match_rules():
    variant = load_pipeline_text("extends: qwen3-tts-1.7b.yaml\nname: qwen3-tts-variant\n", "variant.yaml")
    assert model_catalog()["qwen3-tts-1.7b"].match and not variant.match


@pytest.mark.parametrize("condition", ["{key: a}", "{key: a, equals: 1, truthy: true}", "{key: a..b, equals: 1}"])
def test_a_condition_sets_one_test_on_a_dotted_path(condition):
    with pytest.raises(CatalogError, match="variant.yaml: field match"):
        text = f"extends: qwen3-tts-1.7b.yaml\nname: x\nmatch:\n  - model_type: x\n    when: [{condition}]\n"
        load_pipeline_text(text, "variant.yaml")
