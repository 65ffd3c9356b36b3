"""Optimisers and training methods: AGS (``ags``) and the large-batch baselines."""

from .ags import AGS, GradientVariability
from .methods import Method, build_method

__all__ = ["AGS", "GradientVariability", "Method", "build_method"]
