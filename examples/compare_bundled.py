"""Side by side: vLLM-Omni 0.30's bundled Qwen3-Omni config vs omni-autoconf's plan.

Both are evaluated by the same memory model on 2x H100-80GB. Run:
    .venv/bin/python examples/compare_bundled.py
and paste the table into docs/cpsat.md (tests/test_examples.py checks that it is current).
"""

from __future__ import annotations

from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.inputs.gpus import parse_gpus
from omni_autoconf.planning.evaluation import Placement, evaluate
from omni_autoconf.planning.planner import Request, plan
from omni_autoconf.vllm.facts import GiB, omni_version

# vllm-omni 0.30 deploy/qwen3_omni_moe.yaml ("verified on 2x H100"): stage 0 on cuda:0
# at 0.9, stages 1 and 2 on cuda:1 at 0.6 and 0.1, TP 1 throughout.
BUNDLED = {
    "thinker": Placement((0,), 1, 0.9),
    "talker": Placement((1,), 1, 0.6),
    "code2wav": Placement((1,), 1, 0.1),
}


def table() -> str:
    version = omni_version("0.30")
    request = Request(
        pipeline=lookup_model("qwen3-omni-moe"),
        gpus=tuple(parse_gpus("2xH100-80GB")),
        version=version,
        schema=version.schema,
    )
    bundled, issues = evaluate(request, BUNDLED)
    assert not issues, issues
    ours = plan(request)
    rows = [
        "| stage | config | devices | TP | util | KV GiB/rank | KV tokens | requests of 65536 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, result in (("bundled 0.30", bundled), ("omni-autoconf", ours)):
        for sp in result.stages:
            kv = sp.stage.has_kv_cache
            rows.append(
                f"| {sp.stage.name} | {name} | {','.join(map(str, sp.devices))} | {sp.tensor_parallel_size} "
                f"| {sp.gpu_memory_utilization:g} | {sp.kv_cache_bytes / GiB:.2f} | "
                + (f"{sp.kv_cache_tokens:,} | {sp.max_concurrency:.2f} |" if kv else "- | - |")
            )
    rows.append("")
    rows.append(
        f"Objective (smallest KV headroom over thinker and talker): bundled {bundled.min_kv_requests:.2f}, "
        f"omni-autoconf {ours.min_kv_requests:.2f} requests of 65536 tokens."
    )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table(), end="")
