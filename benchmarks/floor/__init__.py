"""The floor of a paced HTTP/1.1 token: ``h1_pacer.c``, built here on demand.

``h1_pacer`` does what any paced HTTP/1.1 server must do and nothing else (one ``send()``
per token per connection, on llmsim's 2 ms grid; see its source), so the server CPU per
token it shows under the same load is what the kernel's send and the wake-ups cost on
this machine at that moment.  :mod:`benchmarks.scenarios.paced_cost` runs it beside
llmsim at the HTTP/1.1 loads: issue 16 calls one send per token per connection the floor.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from benchmarks.servers import ServerSpec

__all__ = ["SOURCE", "build", "h1_pacer"]

SOURCE = Path(__file__).with_name("h1_pacer.c")


def build(directory: Path) -> Path | None:
    """``h1_pacer`` compiled into ``directory`` (again only when its source is newer);
    None when this machine has no C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    binary = directory / "h1_pacer"
    if not binary.exists() or binary.stat().st_mtime < SOURCE.stat().st_mtime:
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run([compiler, "-O2", "-o", str(binary), str(SOURCE)], check=True)
    return binary


def h1_pacer(name: str, directory: Path, ttft: float, itl: float) -> ServerSpec | None:
    """The floor server paced at ``ttft`` and ``itl`` (seconds), built into ``directory``;
    None without a C compiler."""
    binary = build(directory)
    if binary is None:
        return None
    return ServerSpec(name, (str(binary), "{port}", f"{ttft * 1000:g}", f"{itl * 1000:g}"))
