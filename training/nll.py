"""Next-token nats over windows: the one definition pretraining's per-domain validation and bits/char share.

Every token of a stream is predicted exactly once, from the token before it and at most `window` - 1 more: the
stream (after one context token, the document separator the model saw before every document) is cut into
independent windows. A window's first tokens see little context, so a smaller `window` reads higher; both users
state theirs (pretraining: its training context; bits/char: 256, 3LM's).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm


@torch.no_grad()
def token_nats(model, ids: np.ndarray | list[int], context_id: int, window: int = 256, batch: int = 16,
               progress: bool = False, part: tuple[int, int] = (0, 1)) -> np.ndarray:
    """Next-token nats of every token of `ids`, each predicted exactly once: the sequence [context_id] + ids is cut
    into windows of `window` predicted tokens, each scored independently; the last window may be shorter.
    `part` = (rank, world): score only every world-th batch of windows from `rank`, the rest left at 0 (the ranks'
    arrays then sum to the whole). No float64 on the device (MPS has none): the host widens."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    seq = np.concatenate([[context_id], ids]).astype(np.int64)
    nats = np.zeros(n, dtype=np.float64)
    device = next(model.parameters()).device
    model.eval()
    full = n // window
    rows = [(w * window, window) for w in range(full)] + ([(full * window, n - full * window)] if n % window else [])
    groups = [rows[i:min(i + batch, full)] for i in range(0, full, batch)] + ([rows[full:]] if n % window else [])
    rank, world = part
    for group in tqdm(groups[rank::world], disable=not progress or None, desc="bits/char", leave=False):
        width = group[0][1]
        x = torch.from_numpy(np.stack([seq[start:start + width + 1] for start, _ in group])).to(device)
        logits = model(x[:, :-1], use_cache=False).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
        loss = loss.view(len(group), width).cpu().numpy().astype(np.float64)
        for (start, _), row in zip(group, loss):
            nats[start:start + width] = row
    return nats
