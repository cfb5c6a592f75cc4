"""The pytest plugin's fixtures, as a user's test suite would use them: here (in this
repository's trio_mode), and in a fresh project with no pytest configuration at all."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from llmsim.config import Config
from llmsim.server import ServerHandle

README = Path(__file__).parents[2] / "README.md"


@pytest.fixture
def llmsim_config() -> Config:
    """Overriding the plugin's config fixture, as the README shows."""
    return Config(port=0, served_model_name=("plugin-model",), time_to_first_token=0.001)


async def test_llmsim_server_fixture_serves_on_a_free_port(llmsim_server: ServerHandle) -> None:
    assert llmsim_server.port > 0
    assert llmsim_server.url == f"http://127.0.0.1:{llmsim_server.port}"
    async with httpx.AsyncClient(base_url=llmsim_server.url) as client:
        models = (await client.get("/v1/models")).json()
        completion = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert [card["id"] for card in models["data"]] == ["plugin-model"]
    assert completion.status_code == 200 and completion.json()["model"] == "plugin-model"
    stats = llmsim_server.statistics()
    assert stats.requests_served == 2 and stats.active_streams == 0 and stats.running == 0


def readme_pytest_example() -> str:
    """The Python block of README's "In a pytest suite" section."""
    section = README.read_text(encoding="utf-8").split("\n## In a pytest suite\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "README's pytest section should show exactly one example"
    return str(blocks[0])


@pytest.mark.slow
def test_readme_example_passes_in_a_project_without_pytest_configuration(tmp_path: Path) -> None:
    """README's example, verbatim, in a directory with no pytest.ini, pyproject.toml or
    conftest.py (so no trio_mode): the plugin alone must make its async fixture work."""
    (tmp_path / "test_readme_example.py").write_text(readme_pytest_example(), encoding="utf-8")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b1 passed\b", result.stdout), result.stdout
    assert f"rootdir: {tmp_path}" in result.stdout and "configfile" not in result.stdout, result.stdout
