"""The plan's and training's figures of a model of sequences (#44 item 6: "the tables, plots and
``tula simulate`` show them"): where the plan's rows have a sequence length, the plan plot is against
the tokens of a batch (B x L), one curve per (L, variant) with a legend where several lengths or
variants are planned, the choice labelled with its L, parallelism and checkpointing; the training
figure's title says the step trained.  A CNN's figures are as before.  Plans made by hand from the
stored models record (``tests/data/records``): no worlds, about 2 s."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import epoch, train_record

from tula.core.effects import CheckpointingEffect, ShardingEffect
from tula.core.plan import make_plan
from tula.core.spec import spec_from_dict
from tula.report import plan_figure, plot_plan, training_figure

RECORDS = Path(__file__).parent / "data" / "records"


def _spec(lengths: list[int] | None = None, variants: bool = False) -> dict:
    """tiny_gpt on ``text`` of 32 tokens a sample on 1 or 2 workers, planned over ``lengths``, and
    (``variants``) over DDP and FSDP, with and without checkpointing."""
    search: dict = {"cluster_sizes": [1, 2], "min_batch": 8, "max_batch": 32}
    if lengths is not None:
        search["sequence_lengths"] = lengths
    train: dict = {"method": "lbt", "noise_scale": False}
    if variants:
        train |= {"parallelism": "auto", "checkpointing": "auto"}
    return {
        "name": "tokens-plot",
        "model": {"name": "tiny_gpt", "kwargs": {"n_layers": 2, "d_model": 64, "n_heads": 2, "max_positions": 128}},
        "data": {"name": "text", "sequence_length": 32, "num_samples": 512},
        "search": search,
        "train": train,
    }


def _models(spec: dict) -> dict:
    """The stored models record under ``spec``, with a term in B*L fitted from L = 32 and, where the spec
    plans the variants, the checkpointing and sharding effects fitted."""
    models = json.loads((RECORDS / "models.json").read_text())
    models["spec"] = spec_from_dict(spec).to_dict()
    models["memory"] |= {"sequence_length": 32, "bytes_per_token": 100.0}
    models["perf"] |= {"sequence_length": 32, "c1_per_token": 2e-6}
    if spec["train"].get("parallelism") == "auto":
        activations = models["memory"]["activation_bytes_per_sample"]
        models["checkpointing"] = CheckpointingEffect(
            activation_bytes_per_sample=activations // 3,
            plain_activation_bytes_per_sample=activations,
            static_delta_bytes=0,
            compute_factor=1.3,
            trials=2,
        ).to_dict()
        models["sharding"] = ShardingEffect(
            gather_bytes=50_000, sync_s=0.002, n_workers=2, state_bytes=159_096, trials=3, gather_s=0.001
        ).to_dict()
    return models


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_plan_over_lengths_and_variants_draws_one_curve_per_length_and_variant(tmp_path):
    models = _models(_spec([16, 32], variants=True))
    plan = make_plan(models, "time")
    steps = sorted({(r.sequence_length, r.parallelism, r.checkpointing) for r in plan.configurations if r.feasible})
    assert len(steps) == 8  # L 16 and 32, DDP and FSDP, with and without checkpointing
    trials = [{**t, "sequence_length": 32} for t in models["trials"]]  # the profile's: the plain step at L = 32
    fig = plan_figure(plan, trials)
    ax_t, ax_c = fig.axes
    words = [f"L={n}, {p}" + (", checkpointed" if c else "") for n, p, c in steps]
    for ax in (ax_t, ax_c):
        labels = _legend(ax)
        assert [label for label in labels if label.startswith("L=")] == words
        assert {"N=1", "N=2"} <= set(labels)  # the line style of each cluster size
        c = plan.choice
        chosen = [label for label in labels if label.startswith("chosen: ")]
        assert chosen == [
            f"chosen: N={c.n_workers}, B={c.global_batch} ({c.global_batch * c.sequence_length} tokens), "
            f"L={c.sequence_length}, {c.parallelism}" + (", checkpointed" if c.checkpointing else "")
        ]
        assert ax.get_xlabel() == "tokens per global batch, B x L"
    # each step's lines: its rows' tokens, B x L, and their predicted times
    fsdp = [line for line in ax_t.get_lines() if line.get_label() == "L=16, fsdp"]
    assert len(fsdp) == 1  # FSDP plans N = 2 only: one line, labelled
    rows = sorted(
        (r.global_batch, r.total_time_s)
        for r in plan.configurations
        if r.feasible and (r.sequence_length, r.parallelism, r.checkpointing) == (16, "fsdp", False)
    )
    assert list(fsdp[0].get_xdata()) == [b * 16 for b, _ in rows]
    assert list(fsdp[0].get_ydata()) == [t for _, t in rows]
    points = [line for line in ax_t.get_lines() if line.get_marker() == "o" and len(line.get_xdata()) == 1]
    assert sorted(float(p.get_xdata()[0]) for p in points) == sorted(t["global_batch"] * 32 for t in trials)
    assert plot_plan(plan, trials, tmp_path / "plan.png").stat().st_size > 0


def test_a_plan_at_one_length_is_per_cluster_size_against_tokens():
    plan = make_plan(_models(_spec()), "time")
    assert {(r.sequence_length, r.parallelism, r.checkpointing) for r in plan.configurations} == {(32, "ddp", False)}
    ax_t, _ = plan_figure(plan, []).axes
    labels = _legend(ax_t)
    c = plan.choice
    assert labels == [
        "N=1 predicted",
        "N=2 predicted",
        f"chosen: N={c.n_workers}, B={c.global_batch} ({c.global_batch * 32} tokens), L=32, ddp",
    ]
    assert ax_t.get_xlabel() == "tokens per global batch, B x L"


def test_a_cnn_s_plan_plot_is_as_before():
    models = json.loads((RECORDS / "models.json").read_text())
    plan = make_plan(models, "time")
    fig = plan_figure(plan, models["trials"])
    ax_t, ax_c = fig.axes
    c = plan.choice
    chosen = f"chosen: N={c.n_workers}, B={c.global_batch}"
    per_size = [f"N={n} {what}" for n in (1, 2) for what in ("predicted", "to accuracy", "measured")]
    assert _legend(ax_t) == [*per_size, chosen]
    assert ax_t.get_xlabel() == ax_c.get_xlabel() == "global batch B"
    assert fig._suptitle.get_text() == f"{models['spec']['name']}: objective time (dotted: knee per cluster size)"


def test_the_training_figure_says_the_step_trained_where_it_has_a_length():
    train = {"method": "lbt", "noise_scale": False, "parallelism": "fsdp", "checkpointing": "on"}
    spec = spec_from_dict({**_spec(), "train": train})
    run = train_record([epoch(1)], spec=spec.to_dict(), method="lbt")
    title = training_figure(run)._suptitle.get_text()
    assert title == "tokens-plot: lbt at L=32, B=64 (2048 tokens a batch), fsdp, checkpointing on"
    assert training_figure(train_record([epoch(1)]))._suptitle is None  # a CNN's: as before
