"""Pick a Japanese-capable font for matplotlib figures when the machine has one (labels are often Japanese).
Lazy imports: matplotlib loads only when a figure is drawn."""

from __future__ import annotations

import warnings

CANDIDATES = ("Noto Sans CJK JP", "Noto Sans JP", "IPAexGothic", "IPAGothic", "TakaoGothic", "Hiragino Sans",
              "Yu Gothic", "Meiryo", "VL Gothic", "Droid Sans Fallback")
_warned = False


def use_japanese_font() -> str | None:
    """Set the first installed candidate as matplotlib's sans-serif font; returns its name (None: none found)."""
    import matplotlib
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    if not installed.intersection(CANDIDATES):  # a font installed after matplotlib built its cache is invisible
        font_manager.fontManager = font_manager._load_fontmanager(try_read_cache=False)
        installed = {f.name for f in font_manager.fontManager.ttflist}
    for name in CANDIDATES:
        if name in installed:
            matplotlib.rcParams["font.family"] = "sans-serif"
            matplotlib.rcParams["font.sans-serif"] = [name, *matplotlib.rcParams["font.sans-serif"]]
            return name
    global _warned
    if not _warned:  # once per process: every figure after this one has the same problem
        _warned = True
        warnings.warn("no Japanese font found: Japanese labels in figures will show as empty boxes. Install one, e.g. "
                      "`sudo apt-get install fonts-ipaexfont-gothic` (Debian/Ubuntu) or Noto Sans CJK JP",
                      UserWarning, stacklevel=2)
    return None
