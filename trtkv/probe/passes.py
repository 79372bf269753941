"""One pass of token ids through the model with a (quantized) cache: chunked on a windowed cache,
the last layer at the scored rows only; what measure.py, needles.py and the per-layer analysis
run."""

from __future__ import annotations

import torch

from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.probe.window import WINDOW_CHUNK, LastLayerAt, WindowedKVCache


def feed(
    model,
    ids: torch.Tensor,
    cache: QuantizedKVCache,
    chunk: int | None,  # noqa: ANN001
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run ids [batch, T] through the model with the cache; return the last hidden states [batch, T,
    hidden], or at `positions` (indices into T) only [batch, len(positions), hidden]: on a windowed
    cache the last layer then runs at those rows only (trtkv.probe.window.LastLayerAt)."""
    outs = []
    start = 0
    total = ids.shape[1]
    windowed = isinstance(cache, WindowedKVCache)
    if chunk is None and windowed:
        # chunked prefill: the sliding layers attend chunk x (window + chunk), not n x n
        chunk = WINDOW_CHUNK
    layers = model.model.layers
    last = (
        LastLayerAt(layers[-1])
        if positions is not None and windowed and LastLayerAt.supports(layers[-1])
        else None
    )
    wanted = None if positions is None else positions.to(torch.long).cpu()
    try:
        if last is not None:
            layers[-1] = last
        with torch.inference_mode():
            while start < total:
                if chunk is None:
                    end = total
                else:
                    seen = cache.get_seq_length()
                    # align with the window flush grid
                    end = min(total, start + chunk - (seen % chunk))
                if last is not None and wanted is not None:
                    last.rows = wanted[(wanted >= start) & (wanted < end)] - start
                out = model.model(
                    input_ids=ids[:, start:end], past_key_values=cache, use_cache=True
                )
                hidden = out.last_hidden_state
                if last is None and wanted is not None:
                    hidden = hidden[:, wanted[(wanted >= start) & (wanted < end)] - start]
                outs.append(hidden)
                start = end
    finally:
        if last is not None:
            layers[-1] = last.layer
    return torch.cat(outs, dim=1)
