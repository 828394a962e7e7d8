"""Verified configs are data too: each config a vLLM-Omni release ships as verified on named
hardware starts on that hardware under `check`, and the plan for that hardware holds at
least its smallest KV headroom; a release's file of a version the catalog does not model
is refused by `check` with exit 2. (The wheels come from PyPI; offline, these tests skip.)

The (model, version) cells are chosen at collection: a version for which FILES names no
file is not a cell; one the catalog does not model is a refusal cell."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.planning.check import check_config
from omni_autoconf.inputs.configfile import read_config
from omni_autoconf.inputs.gpus import parse_gpus
from omni_autoconf.planning.planner import plan
from omni_autoconf.vllm.facts import omni_version

from conftest import make_request
from wheels import wheel_root

FILES = {  # catalog model -> its bundled file, legacy (0.14-0.18) and deploy (0.20+)
    "qwen3-omni-moe": ("model_executor/stage_configs/qwen3_omni_moe.yaml", "deploy/qwen3_omni_moe.yaml"),
    "qwen2.5-omni-7b": ("model_executor/stage_configs/qwen2_5_omni.yaml", "deploy/qwen2_5_omni.yaml"),
    "qwen3-omni-moe-thinking": (None, "deploy/qwen3_omni_moe_thinking.yaml"),  # bundled from 0.26
    "qwen3-tts-1.7b": (None, "deploy/qwen3_tts.yaml"),  # modelled for 0.30 only
    "qwen3-tts-0.6b": (None, "deploy/qwen3_tts.yaml"),  # the same file serves both sizes
    "bagel-7b-mot": (None, "deploy/bagel.yaml"),  # "verified on NVIDIA A100 (80GB)"
    "step-audio-2-mini-asr": (None, "deploy/step_audio2_ci.yaml"),  # "validated here on 1x H100-80GB"
    "moss-tts-nano": (None, "deploy/moss_tts_nano.yaml"),  # "Verified on 1x L4 24GB"
    "voxtral-4b-tts": (None, "deploy/voxtral_tts.yaml"),  # "Verified on 1× H20"
    "glm-tts": (None, "deploy/glm_tts.yaml"),  # "Verified on 1x A40 48GB"
    "fish-s2-pro": (None, "deploy/fish_qwen3_omni.yaml"),  # "Verified on 1× H20"
    "audio8-tts-0.6b": (None, "deploy/audio8_tts.yaml"),  # "Measured on 1x H20", in its stage 0 comment
    "moss-tts": (None, "deploy/moss_tts_80gb.yaml"),
    "moss-tts-local-1.5": (None, "deploy/moss_tts_local_h200.yaml"),
    "ming-tts-16.8b-a3b": (None, "deploy/ming_tts_moe.yaml"),
    "minimax-music3": (None, "deploy/minimax_music3.yaml"),
    "audex-tts-2b": (None, "deploy/audex_tts.yaml"),  # "Verified on 1x H100."
    "audex-tts-30b-a3b": (None, "deploy/audex_tts_30b.yaml"),
    "breeze-tts-2": (None, "deploy/breeze_tts_2_throughput.yaml"),
    "ming-flash-omni-2.0": (None, "deploy/ming_flash_omni.yaml"),
    "covo-audio-chat": (None, "deploy/covo_audio.yaml"),
    # the 5090D file's recipe runs it with MIMO_AUDIO_TOKENIZER_DEVICE=cpu, which this entry assumes
    "mimo-audio-7b-tokenizer-cpu": (None, "deploy/mimo_audio_5090d.yaml"),
}
# files whose hardware sentence the pattern below does not read: the sentence, quoted, and the cards it names
MEASURED = {"audio8-tts-0.6b": ("Measured on 1x H20 (20 prompts, mean audio 4.5 s)", "1xH20"),
            "moss-tts": ("both stages initialize on one H100/H800 80GB", "1xH100-80GB"),
            "moss-tts-local-1.5": ("both stages on one H200", "1xH200"),
            "ming-tts-16.8b-a3b": ("fits 97GB H20", "1xH20"),
            "minimax-music3": ("both on one 140 GB card", "1xH200"),
            "audex-tts-30b-a3b": ("Single H100 80GB layout: thinker 0.85 + decoder 0.08 share GPU 0", "1xH100-80GB"),
            "breeze-tts-2": ("tested on one H100 80 GB", "1xH100-80GB"),
            # its GPUs: devices 0-3 (the recipe's 4x H100 80GB)
            "ming-flash-omni-2.0": ("verified and required on devices with 80GB memory", "4xH100-80GB"),
            "covo-audio-chat": ("Verified on 1x A100-80G.", "1xA100-80GB"),
            "mimo-audio-7b-tokenizer-cpu": ("MiMo-Audio deploy for 1x RTX 5090 / 5090D 32GB", "1xRTX5090")}
VERSIONS = ["0.14", "0.16", "0.18", "0.20", "0.22", "0.24", "0.26", "0.28", "0.30"]
VERIFIED = re.compile(r"(?:verified|validated here) on (?:(\d+)[x×] (H100|L4|H20|A40)|NVIDIA (A100) \(80GB\))", re.I)
CATALOG_NAME = {"H100": "H100-80GB", "A100": "A100-80GB", "L4": "L4", "H20": "H20", "A40": "A40"}  # the verified comments' cards


def _schema(version: str) -> str:
    return "deploy" if version >= "0.20" else "stage-args"


def _file_name(model: str, version: str) -> str | None:
    legacy, deploy = FILES[model]
    return deploy if version >= "0.20" else legacy


# the cells: a release's file (FILES names one for that version) the catalog models, and the
# files of versions it does not model (their refusal is tested instead)
SHIPPED = [(m, v) for m in sorted(FILES) for v in VERSIONS if _file_name(m, v) is not None]
MODELLED = [(m, v) for m, v in SHIPPED if lookup_model(m).unserved_reason(_schema(v), v) is None]
UNMODELLED = [(m, v) for m, v in SHIPPED if (m, v) not in MODELLED]


def _bundled(model: str, version: str):
    path = wheel_root(version) / "vllm_omni" / _file_name(model, version)
    assert path.is_file(), f"vllm-omni {version} ships no {path.name}"
    if model in MEASURED:
        sentence, gpus = MEASURED[model]
        flat = " ".join(line.strip().lstrip("#").strip() for line in path.read_text().splitlines())
        assert sentence in flat  # the comment's lines joined
        return path, gpus
    head = "\n".join(path.read_text().splitlines()[:20])
    m = VERIFIED.search(head)
    assert m is not None, f"{path.name} of {version} names no hardware it was verified on"
    count, name = (m.group(1), m.group(2)) if m.group(2) else ("1", m.group(3))
    return path, f"{count}x{CATALOG_NAME[name.upper()]}"


@pytest.mark.parametrize("model, version", MODELLED, ids=["-".join(cell) for cell in MODELLED])
def test_a_verified_config_starts_on_its_hardware(model, version):
    path, gpus = _bundled(model, version)
    v = omni_version(version)
    config = read_config(str(path), engine_extras=v.deploy_reads_engine_extras)
    report = check_config(lookup_model(model), parse_gpus(gpus), v, config)
    assert report.ok, [p.message for p in report.errors]


@pytest.mark.parametrize("model, version", UNMODELLED, ids=["-".join(cell) for cell in UNMODELLED])
def test_a_release_file_of_a_version_the_catalog_does_not_model_is_refused_by_check(model, version):
    """The cells the test above leaves out. Where that release does not ship the file yet, the
    newest release's file stands in: the refusal is the version's, whatever the file says."""
    reason = lookup_model(model).unserved_reason(_schema(version), version)
    assert reason is not None and model in reason
    path = wheel_root(version) / "vllm_omni" / _file_name(model, version)
    if not path.is_file():
        path = wheel_root(VERSIONS[-1]) / "vllm_omni" / _file_name(model, VERSIONS[-1])
    result = CliRunner().invoke(main, ["check", str(path), "--gpus", "1xH200", "--model", model,
                                       "--omni-version", version])
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [f"omni-autoconf: error: {reason}"]


def test_every_file_has_a_modelled_version():
    assert {m for m, _ in MODELLED} == set(FILES)


@pytest.mark.parametrize("model", sorted(FILES))
def test_the_plan_holds_at_least_the_verified_configs_smallest_headroom(model):
    path, gpus = _bundled(model, "0.30")
    v = omni_version("0.30")
    pipeline = lookup_model(model)
    report = check_config(pipeline, parse_gpus(gpus), v, read_config(str(path)))
    settings = {o.run.name: o for o in report.stages}
    # headroom as the planner counts it: KV requests, capped at max_num_seqs unless prefix
    # caching can use the rest
    bundled = min((o.max_concurrency if pipeline.prefix_caching(pipeline.stage(o.run.name), "deploy")
                   else min(o.max_concurrency, o.run.knobs.max_num_seqs) for o in report.stages if o.run.has_kv),
                  default=0.0)  # a pipeline without a KV stage: the plan has only to exist
    knobs = {name: o.run.knobs for name, o in settings.items()}
    result = plan(make_request(model, gpus, "0.30",
                               max_model_len={n: k.max_model_len for n, k in knobs.items() if pipeline.stage(n).has_kv_cache},
                               max_num_seqs={n: k.max_num_seqs for n, k in knobs.items()},
                               max_num_batched_tokens={n: k.max_num_batched_tokens for n, k in knobs.items()}))
    assert result.min_kv_requests >= bundled


def test_the_qwen3_tts_plan_on_one_rtx4090_splits_the_card_better_than_the_bundled_file():
    """How to split one small card between the Qwen3-TTS talker and code2wav: the plan gives
    code2wav what it holds (its fraction reserves nothing: no KV cache) and the talker the
    rest, and it still fits the card; the bundled 0.3/0.3 split, judged on the same card,
    leaves the talker less KV."""
    path, _ = _bundled("qwen3-tts-1.7b", "0.30")
    pipeline, gpus, v = lookup_model("qwen3-tts-1.7b"), parse_gpus("1xRTX4090"), omni_version("0.30")
    bundled = check_config(pipeline, gpus, v, read_config(str(path)))
    assert bundled.ok, [p.message for p in bundled.errors]
    ours = plan(make_request("qwen3-tts-1.7b", "1xRTX4090", "0.30"))
    talker, code2wav = ours.stages
    assert talker.devices == code2wav.devices == (0,)
    assert code2wav.gpu_memory_utilization < 0.3 < talker.gpu_memory_utilization
    (gpu,) = ours.gpus
    assert gpu.free_bytes >= 0
    kv = {o.run.name: o.max_concurrency for o in bundled.stages if o.run.has_kv}
    assert talker.max_concurrency > kv["talker"]
