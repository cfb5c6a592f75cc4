"""The compiled per-token path, ``llmsim._speedups`` (native/*.c): optional.

Everything else is in pyproject.toml.  Where no C compiler is, the build of the
extension fails softly (``optional=True``) and llmsim runs its pure-Python twins
(llmsim/speedups.py says which twins there are and how to switch them off).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "llmsim._speedups",
            sources=[
                f"native/{name}.c"
                for name in (
                    *("speedups", "engine_run", "engine_advance", "sink"),
                    *("h2_write", "h1_write", "wake", "flush"),
                )
            ],
            depends=["native/speedups.h"],
            optional=True,
        )
    ]
)
