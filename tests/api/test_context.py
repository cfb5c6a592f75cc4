"""The shared handler context: the choices' seeded RNGs."""

from __future__ import annotations

import random

import pytest

from llmsim.api.context import seeded_random


@pytest.mark.parametrize("text", ["7:abcdef0123456789:0", "None:req-1:3", "é✓:x:12", ""])
def test_seeded_random_is_random_random_of_the_text(text: str) -> None:
    """The same state as ``random.Random(text)``, so every seeded output stays as it was."""
    ours, theirs = seeded_random(text), random.Random(text)
    assert type(ours) is random.Random
    assert ours.getstate() == theirs.getstate()
    assert [ours.random() for _ in range(700)] == [theirs.random() for _ in range(700)]  # past one regeneration
    assert [ours.gauss(0.0, 1.0) for _ in range(3)] == [theirs.gauss(0.0, 1.0) for _ in range(3)]
