"""Pick a Japanese-capable font for matplotlib figures when the machine has one (labels are often Japanese)."""

from __future__ import annotations

CANDIDATES = ("Noto Sans CJK JP", "Noto Sans JP", "IPAexGothic", "IPAGothic", "TakaoGothic", "Hiragino Sans",
              "Yu Gothic", "Meiryo", "VL Gothic", "Droid Sans Fallback")


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
    return None
