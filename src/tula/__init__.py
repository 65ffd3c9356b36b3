"""Tula: profile, model and plan distributed large-batch training of PyTorch models.

The pipeline, one record per stage (see ``docs/`` and ``DESIGN.md``)::

    JobSpec -> profile -> Profile -> fit -> FittedModels -> plan -> Plan -> report
"""

__version__ = "0.1.0"
