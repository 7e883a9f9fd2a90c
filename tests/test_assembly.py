"""Building an ``Agent`` from an agent.json: the provider, the tools, the retriever and
the MCP toolsets the manifest names, and the errors for what it cannot resolve."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_harness import manifest_file
from openstarry.agent.runtime import Agent
from openstarry.errors import ManifestError


def test_an_unknown_retriever_name_says_what_is_known(tmp_path: Path) -> None:
    path = manifest_file(tmp_path, {"toolRetrieval": {"topN": 2, "retriever": "embedding"}})
    with pytest.raises(ManifestError, match=r"unknown retriever 'embedding': 'lexical' or"):
        Agent.from_manifest(path)
