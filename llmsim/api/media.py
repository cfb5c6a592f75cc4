"""The render family's media readers, for the generating endpoints (chat, messages,
responses), imported on first use.

The render family imports the request modules of those endpoints, and each endpoint
package imports its routes: importing ``llmsim.api.render`` from a route module at the
top would be a cycle.  An import statement inside the handler costs about 8,000
instructions each time it runs; :func:`media_readers` imports once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from llmsim.engine.kv_hashing import MultimodalItem
from llmsim.model.tokenizer import ChatTurn, Tokenizer

if TYPE_CHECKING:
    from llmsim.api.chat.request import ChatMessage
    from llmsim.api.messages.request import MessagesRequest
    from llmsim.api.render.features import MediaItem
    from llmsim.api.responses.request import ResponsesInput

__all__ = ["MediaReaders", "media_readers"]


class MediaReaders(NamedTuple):
    """``llmsim.api.render``'s functions the generating endpoints call."""

    kv_multimodal: Callable[[Tokenizer, Sequence[ChatTurn], Sequence[MediaItem]], tuple[MultimodalItem, ...]]
    chat_media: Callable[[Sequence[ChatMessage]], list[MediaItem]]
    messages_media: Callable[[MessagesRequest], list[MediaItem]]
    responses_media: Callable[[ResponsesInput | None], list[MediaItem]]


@functools.cache
def media_readers() -> MediaReaders:
    from llmsim.api.render.features import kv_multimodal
    from llmsim.api.render.sources import chat_media, messages_media, responses_media

    return MediaReaders(kv_multimodal, chat_media, messages_media, responses_media)
