"""The core layer: the records, the rules and the pure models -- what Tula knows without
running anything.

The job spec and the records every stage hands on (:mod:`.spec`, :mod:`.records`), a
configuration as a value (:mod:`.config`), the tables of methods and batch schedules and the
rules that read a spec against them, among them the one that decides the configuration to
train at (:mod:`.registry`, :mod:`.schedules`, :mod:`.job_rules`), the memory and performance models
and their fit (:mod:`.memory_model`, :mod:`.perfmodel`, :mod:`.fit`), pricing, the search
space, the planner with its knee and the simulator (:mod:`.pricing`, :mod:`.space`,
:mod:`.plan`, :mod:`.kneedle`, :mod:`.simulate`), the gradient noise scale's arithmetic
(:mod:`.noise_scale`), and the errors and plain-text rules everything reports with
(:mod:`.errors`, :mod:`.say`).

May import: the standard library, numpy, scipy, pydantic, PyYAML, rich -- and nothing
else of Tula's.  Never torch, FastAPI or SQLAlchemy: planning runs where none of them is
installed or loaded (``make lint`` checks this with import-linter).
"""
