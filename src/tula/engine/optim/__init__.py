"""Optimisers and training methods: AGS (``ags``) and the large-batch baselines."""

from tula.engine.optim.ags import AGS, GradientVariability
from tula.engine.optim.methods import Method, build_method

__all__ = ["AGS", "GradientVariability", "Method", "build_method"]
