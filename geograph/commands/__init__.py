"""The command modules behind ``geograph demo``, ``geograph build-graph`` and ``geograph embed``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse


def checked_encoder_options(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`geograph.console.encoder_options`, and a hub id given to ``--encoder`` that cannot be
    fetched (offline and not in the local Hugging Face cache, no network, no such model) as one
    :class:`~geograph.console.UsageError` line before any work starts."""
    from geograph.console import UsageError, encoder_options
    from geograph.data.cache import EncoderUnavailable, check_model

    options = encoder_options(args)
    if options["model"] is not None:
        try:
            check_model(options["model"], probe=True)
        except EncoderUnavailable as e:
            raise UsageError(f"--encoder: {e}") from None
    return options
