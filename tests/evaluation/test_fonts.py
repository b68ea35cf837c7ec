"""Japanese text in figures (evaluation/fonts.py): a missing font is named once."""

from __future__ import annotations

import warnings

import pytest


def test_a_missing_japanese_font_is_named_once(monkeypatch):
    from hitoban.evaluation import fonts

    monkeypatch.setattr(fonts, "CANDIDATES", ("No Such Font For hitoban",))
    monkeypatch.setattr(fonts, "_warned", False)
    with pytest.warns(UserWarning, match="fonts-ipaexfont-gothic"):
        assert fonts.use_japanese_font() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fonts.use_japanese_font() is None  # said once, not for every figure
