"""Catalog variants: a catalog file that `extends` another beside it (a sibling checkpoint
or another topology of one pipeline) is merged with its base here, before validation."""

from __future__ import annotations

from importlib import resources

from ..errors import CatalogError
from .yamlio import parse_mapping


def extended(variant: dict, filename: str) -> dict:
    """A variant over the catalog file it `extends` (a sibling checkpoint of one pipeline):
    its top-level keys replace the base's; its `stages` are partial stages matched by name,
    each key replacing the base stage's, or whole stages the base lacks (a stage_id after the
    base's last), appended. `keep_stages` (base stage names) keeps only those, renumbered in
    that order, for a topology that runs fewer stages of one checkpoint. The base's `match`
    rules are not inherited (a variant is another checkpoint or topology: it says its own).
    One level only: a base extends nothing."""
    base_name = variant["extends"]
    folder = resources.files("omni_autoconf.models")
    if not isinstance(base_name, str) or not base_name.endswith(".yaml") or "/" in base_name \
            or not folder.joinpath(base_name).is_file():
        raise CatalogError(f"{filename}: extends {base_name!r} is not a catalog file beside it")
    base = parse_mapping(folder.joinpath(base_name).read_text(), base_name, CatalogError)
    if "extends" in base:
        raise CatalogError(f"{filename}: extends {base_name}, which extends another file (one level only)")
    merged = {**{k: v for k, v in base.items() if k != "match"},
              **{k: v for k, v in variant.items() if k not in ("extends", "stages", "keep_stages")}}
    stages = [dict(st) for st in base.get("stages") or []]
    if "keep_stages" in variant:
        keep = variant["keep_stages"]
        named = {st.get("name"): st for st in stages}
        order = [st.get("name") for st in stages]
        if not isinstance(keep, list) or not keep or any(not isinstance(n, str) or n not in named for n in keep) \
                or sorted(keep, key=order.index) != keep or len(set(keep)) != len(keep):
            raise CatalogError(f"{filename}: keep_stages {keep!r} must list distinct stage names of {base_name}, "
                               "in its order")
        stages = [{**named[n], "stage_id": i} for i, n in enumerate(keep)]
    by_name = {st.get("name"): st for st in stages}
    for partial in variant.get("stages") or []:
        target = by_name.get(partial.get("name")) if isinstance(partial, dict) else None
        if target is not None:
            target.update(partial)
        elif isinstance(partial, dict) and partial.get("stage_id") == len(stages):
            stages.append(dict(partial))
        else:
            raise CatalogError(f"{filename}: stages: {str(partial)[:200]} names no stage of {base_name}, and is not "
                               f"a whole stage {len(stages)} to append")
    merged["stages"] = stages
    return merged
