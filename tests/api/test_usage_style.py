"""``usage_style``: a route's :class:`~llmsim.api.usage.UsageStyle`, made once per value."""

from __future__ import annotations

import itertools

from llmsim.api.usage import CACHE_BLOCK_TOKENS, UsageStyle, usage_style


def test_usage_style_is_the_style_of_its_three_values_each_one_counting() -> None:
    for details, created, block_size in itertools.product((False, True), (False, True), (16, 32)):
        style = usage_style(details, created, block_size)
        assert style == UsageStyle(details, created, block_size)
        assert usage_style(details, created, block_size) is style  # remembered
    assert usage_style(True, False) == UsageStyle(True, False, CACHE_BLOCK_TOKENS)
    assert usage_style.cache_info().maxsize == 16  # bounded
