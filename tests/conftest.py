"""Shared fixtures: requests for the shipped models, built the way the CLI builds them."""

from __future__ import annotations

import pytest

from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.inputs.gpus import parse_gpus
from omni_autoconf.planning.planner import Request
from omni_autoconf.vllm.facts import omni_version


def make_request(model: str, gpus: str, version: str = "0.30", **kw) -> Request:
    v = omni_version(version)
    kw.setdefault("schema", v.schema)
    return Request(pipeline=lookup_model(model), gpus=tuple(parse_gpus(gpus)), version=v, **kw)


@pytest.fixture
def request_for():
    return make_request
