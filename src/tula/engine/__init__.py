"""The engine layer: what measures and trains, with torch.

Launchers that form an N-rank world on this machine or on Dask workers (:mod:`.launch`),
what one rank does (:mod:`.launch.runtime`), DDP and its memory
measurements (:mod:`.ddp`, :mod:`.memory`), the profiler and the trainer (:mod:`.profile`,
:mod:`.train`), models and data sets and the path of their batches to the ranks
(:mod:`.workloads`, :mod:`.data`), the optimisers and training methods (:mod:`.optim`),
checkpoints, run directories and signals (:mod:`.checkpoint`, :mod:`.rundir`,
:mod:`.interrupts`).

May import: :mod:`tula.core`, torch, Dask, and the standard library.  Never the fronts above
it (the CLI, the service, the scikit-learn estimator, the pipeline, the reports): the engine
hands records up and reports progress through callbacks.
"""
