"""GPU and model catalogs: figures, aliases, validation errors."""

from __future__ import annotations

import pytest

from omni_autoconf.inputs.catalog import load_pipeline_text, model_catalog
from omni_autoconf.errors import CatalogError, InputError
from omni_autoconf.inputs.gpus import gpu_catalog, lookup_gpu, parse_gpus
from omni_autoconf.vllm.facts import GiB

REQUIRED_GPUS = [
    "H100-80GB", "H200", "H20", "H800", "A100-40GB", "A100-80GB", "A800-80GB",
    "L40S", "L4", "A10G", "RTX4090", "RTX3090", "RTX5090", "B200",
]


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpus_are_in_the_catalog(name):
    assert name in gpu_catalog()


@pytest.mark.parametrize(
    "name, printed_gib",
    # data/gpus.yaml's evidence, low end of each observed range (what a driver may report at worst).
    [("A100-80GB", 79.15), ("H200", 139.72), ("H100-80GB", 79.11), ("B200", 178.35), ("RTX4090", 23.52)],
)
def test_totals_are_cuda_figures_not_marketing_sizes(name, printed_gib):
    total = gpu_catalog()[name].capacity_bytes / GiB
    assert round(total, 2) in (printed_gib, round(printed_gib - 0.01, 2))
    assert total <= printed_gib


@pytest.mark.parametrize("alias", ["h100", "H100-SXM", "NVIDIA H100 80GB HBM3", "nvidia h100 80gb hbm3"])
def test_aliases_are_case_insensitive(alias):
    assert lookup_gpu(alias).name == "H100-80GB"


def test_rtx_names_with_spaces_and_vendor_prefix():
    assert lookup_gpu("NVIDIA GeForce RTX 4090").name == "RTX4090"
    assert lookup_gpu("rtx-4090").name == "RTX4090"


def test_unknown_gpu_names_the_closest_ones_not_the_whole_list():
    with pytest.raises(InputError) as err:
        lookup_gpu("H1000")
    text = str(err.value)
    assert "H1000" in text and "did you mean H100-80GB" in text and "`omni-autoconf gpus` lists all" in text
    assert "RTX4090" not in text


def test_parse_gpus_keeps_the_written_order():
    gpus = parse_gpus("1xH100-80GB,2xA100-40GB")
    assert [(g.index, g.name) for g in gpus] == [(0, "H100-80GB"), (1, "A100-40GB"), (2, "A100-40GB")]


@pytest.mark.parametrize("text", ["", "2x", "0xH100", "2xH100,,", "2xH100;1xL4", "-1xH100", "1025xH100"])
def test_malformed_gpus_are_input_errors(text):
    with pytest.raises(InputError):
        parse_gpus(text)


def test_shipped_models_load():
    assert {"qwen3-omni-moe", "qwen2.5-omni-7b", "qwen2.5-omni-3b"} <= set(model_catalog())


def test_every_catalog_number_cites_a_source():
    for spec in model_catalog().values():
        for st in spec.stages:
            assert all(c.source for c in st.components)
            assert st.transformer.source


def _valid_text(name: str = "qwen3-omni-moe.yaml") -> str:
    from importlib import resources

    return resources.files("omni_autoconf.models").joinpath(name).read_text()


def test_malformed_catalog_names_file_and_field():
    broken = _valid_text("qwen2.5-omni-7b.yaml").replace("num_kv_heads: 4", "num_kv_heads: four", 1)
    with pytest.raises(CatalogError) as err:
        load_pipeline_text(broken, "broken.yaml")
    message = str(err.value)
    assert message.startswith("broken.yaml: field stages.0.transformer.num_kv_heads")


def test_the_qwen3_catalog_takes_its_geometry_from_the_config_and_may_not_repeat_it():
    thinker = model_catalog()["qwen3-omni-moe"].stage("thinker")
    assert (thinker.transformer.num_layers, thinker.transformer.num_kv_heads, thinker.transformer.head_dim) == (48, 4, 128)
    assert thinker.transformer.deepstack_levels == 3 and thinker.vision_tower.depth == 27
    repeated = _valid_text().replace("    transformer:\n      qk_norm: true", "    transformer:\n      num_layers: 48\n      qk_norm: true", 1)
    with pytest.raises(CatalogError, match="repeats what thinker_config.text_config states: num_layers"):
        load_pipeline_text(repeated, "repeat.yaml")


def test_catalog_rejects_unknown_fields_and_bad_tp():
    with pytest.raises(CatalogError, match="typo.yaml: field colour: Extra inputs are not permitted"):
        load_pipeline_text("colour: red\n" + _valid_text(), "typo.yaml")
    with pytest.raises(CatalogError, match="does not divide"):
        load_pipeline_text(_valid_text().replace("tp_degrees: [1, 2, 4, 8]", "tp_degrees: [1, 3]", 1), "tp.yaml")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_pipeline_text("stages: [", "bad.yaml")
