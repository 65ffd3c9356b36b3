"""``tula.optim``: the optimisers and training methods, where users import them from
(``from tula.optim import AGS``).  They live in :mod:`tula.engine.optim`."""

from tula.engine.optim import AGS, GradientVariability, Method, build_method

__all__ = ["AGS", "GradientVariability", "Method", "build_method"]
