"""B_simple as it behaves: train.png and the dashboard draw it on a log axis, with its running
median and the early estimate, from a synthetic run whose B_simple jumps
from ~50 to 1e6 late in training (no training: seconds)."""

from __future__ import annotations

import math

import pytest
from helpers import epoch, train_record

from tula.core.errors import RecordError
from tula.core.records import TrainRecord
from tula.report import plot_training, training_figure
from tula.service.dashboard_charts import noise_chart, train_charts


def run_record(b_simple: list, batches: list[int] | None = None) -> TrainRecord:
    n = len(b_simple)
    batches = batches or [64] * n
    history = [
        epoch(
            e,
            global_batch=batches[e - 1],
            n_workers=2,
            b_simple=b,
            train_loss=2.0 / e,
            test_loss=2.2 / e,
            test_top1=1 - 1 / (e + 1),
            steps_done=10 * e,
            epoch_time_s=1.0,
            lr=0.1,
        )
        for e, b in zip(range(1, n + 1), b_simple)
    ]
    final = history[-1].to_json_dict() if history else None
    return train_record(history, local_batch=batches[-1] // 2 if batches else 32, train_s=float(n), final=final)


# ~50 for 16 epochs, then up to 1e6 as the mean gradient vanishes; unusable values on the way
JUMP = [48.0, 52.0, 55.0, None, 50.0, 47.0, 53.0, 51.0, 49.0, 56.0, 50.0, 52.0, 60.0, 58.0, 70.0, 90.0]
JUMP += [3e2, 2e3, math.inf, 1e4, 5e4, 0.0, 2e5, 5e5, math.nan, 1e6]


def _noise_axes(fig):
    [ax] = [a for a in fig.axes if "B_simple per epoch" in [ln.get_label() for ln in a.get_lines()]]
    return ax


def test_train_png_draws_b_simple_on_a_log_axis_with_its_median_and_the_early_estimate(tmp_path):
    import matplotlib.pyplot as plt

    run = run_record(JUMP)
    fig = training_figure(run)
    try:
        ax = _noise_axes(fig)
        assert ax.get_yscale() == "log"
        lo, hi = ax.get_ylim()
        assert lo < 50 and hi >= 1e6  # the batch (64) and the jump both on the axis
        labels = [ln.get_label() for ln in ax.get_lines()]
        assert "global batch B" in labels and "B_simple, running median of 5 epochs" in labels
        early = [lab for lab in labels if lab.startswith("early B_simple")]
        assert early == ["early B_simple 52 (median of epochs 1-3)"], labels
        raw = next(ln for ln in ax.get_lines() if ln.get_label() == "B_simple per epoch")
        assert len(raw.get_ydata()) == len(JUMP) - 4  # None, inf, 0 and NaN left out
    finally:
        plt.close(fig)
    png = plot_training(run, tmp_path / "train.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_train_png_without_b_simple_draws_no_noise_panel_or_says_not_measured(tmp_path):
    import matplotlib.pyplot as plt

    fig = training_figure(run_record([None, math.inf, 0.0, None]))  # constant batch: no batch panel
    try:
        assert len(fig.axes) == 2  # accuracy and its loss twin only
    finally:
        plt.close(fig)
    fig = training_figure(run_record([None] * 4, batches=[64, 64, 128, 128]))
    try:
        [ax] = [a for a in fig.axes if a.get_ylabel() == "global batch B"]
        assert "B_simple not measured" in ax.get_title()
    finally:
        plt.close(fig)
    assert plot_training(run_record([None] * 3), tmp_path / "t.png").exists()


def test_the_dashboard_draws_b_simple_on_a_log_axis():
    html = train_charts(run_record(JUMP))
    svg = "<svg" + html.split("<svg")[2]  # the second chart: global batch and B_simple
    assert "Global batch and B_simple" in svg and "data-y-scale='log'" in svg
    ticks = [t.split(">")[-1] for t in svg.split("</text>") if "text-anchor='end'" in t]
    assert {"100", "1000", "1e4", "1e5", "1e6"} <= set(ticks), ticks
    assert "data-label='B_simple, running median of 5 epochs'" in svg
    assert svg.count("data-label='B_simple per epoch'") == len(JUMP) - 4  # None, inf, 0, NaN left out
    assert "early B_simple 52" in svg
    assert "class='band' data-label='early p25-p75 50-53.5'" in svg
    assert "the median of epochs 1-3 (3 measured; p25-p75 50-53.5)" in svg  # epoch 4 (None) is not in it
    # the first chart keeps its linear axis
    assert "data-y-scale='linear'" in html.split("<svg")[1]


@pytest.mark.parametrize("values", [[None] * 5, [math.inf, math.nan, 0.0, -1.0], []])
def test_the_dashboard_says_when_b_simple_was_not_measured(values):
    svg = noise_chart(run_record(values).history) if values else noise_chart([])
    assert "B_simple not measured" in svg and "data-y-scale='log'" in svg
    assert "running median" not in svg and "early B_simple" not in svg
    lines = [h.to_json_dict() for h in run_record([None] * 3).history]  # the same epochs as read from JSON
    assert noise_chart(lines) == noise_chart(run_record([None] * 3).history)


def test_a_metrics_line_with_a_b_simple_that_is_no_number_is_refused_by_name():
    line = {**epoch().to_json_dict(), "b_simple": "n/a"}
    with pytest.raises(RecordError, match=r"^an epoch's metrics line is damaged: field 'b_simple'"):
        noise_chart([line])
