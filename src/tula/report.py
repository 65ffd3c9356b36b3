"""Report stage: rich tables for the terminal and a matplotlib PNG of the plan."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from .records import epoch_score


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.2f}"


def trials_table(profile: dict) -> Table:
    t = Table(title=f"Profile ({profile['search']} search, {profile['device']}, "
                    f"{profile['threads_per_worker']} thread(s)/worker, {profile['profiling_s']:.0f} s)")
    data = any(r.get("t_data_s") is not None for r in profile["trials"])
    cols = ["N", "B", "b", "t_step ms", "t_compute ms", "t_sync ms"] + (["data ms"] if data else []) + \
        ["spread", "peak mem", "status"]
    for col in cols:
        t.add_column(col, justify="right" if col != "status" else "left")
    for r in profile["trials"]:
        style = {"ok": None, "oom": "red", "skipped": "yellow", "error": "red", "interrupted": "yellow"}.get(r["status"])
        spread = "-" if r.get("t_step_spread") is None else f"{r['t_step_spread']:.0%}"
        row = [str(r["n_workers"]), str(r["global_batch"]), str(r["local_batch"]), _ms(r["t_step_s"]),
               _ms(r["t_compute_s"]), _ms(r["t_sync_s"])] + ([_ms(r.get("t_data_s"))] if data else []) + \
            [spread, fmt_bytes(r["peak_mem_bytes"]), r["status"] + (f" ({r['note']})" if r["note"] else "")]
        t.add_row(*row, style=style)
    return t


def models_table(models: dict) -> Table:
    mem, perf, err = models["memory"], models["perf"], models["fit_error"]
    t = Table(title="Fitted models", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row("memory: static", f"params {fmt_bytes(mem['param_bytes'])}, grads {fmt_bytes(mem['grad_bytes'])}, "
              f"optimiser {fmt_bytes(mem['optimizer_state_bytes'])}, buffers {fmt_bytes(mem['buffer_bytes'])}, "
              f"other {fmt_bytes(mem['other_static_bytes'])}")
    t.add_row("memory: per sample", f"activations {fmt_bytes(mem['activation_bytes_per_sample'])}, "
              f"data {fmt_bytes(mem['batch_bytes_per_sample'])}")
    t.add_row("compute", f"t = ({perf['c0'] * 1e3:.3f} ms + {perf['c1'] * 1e6:.2f} us * b) * "
              f"(1 + {perf['kappa']:.3f} (N-1)) + {perf.get('kappa0', 0.0) * 1e3:.3f} ms * (N-1)")
    t.add_row("sync", f"{perf['collective']}: alpha {perf['alpha'] * 1e6:.2f} us/hop, "
              f"bandwidth {1 / perf['beta'] / 1e9 if perf['beta'] > 0 else float('inf'):.3g} GB/s, "
              f"rho {perf['rho']:.3f}, gamma {perf['gamma']:.2f}")
    t.add_row("frozen", ", ".join(perf["frozen"]) or "-")
    t.add_row("in-sample error", f"step time median {err['t_step_median_rel']:.1%} (max {err['t_step_max_rel']:.1%}), "
              f"peak memory median {err['peak_mem_median_rel']:.1%} (max {err['peak_mem_max_rel']:.1%})")
    for note in perf.get("notes", []):
        t.add_row("note", note)
    return t


def plan_table(plan: dict) -> Table:
    t = Table(title=f"Plan (objective: {plan['objective']}); candidate batches and the choice")
    for col in ("", "N", "B", "b", "t_step ms", "epoch s", "total s", "cost", "peak mem", "feasible"):
        t.add_column(col, justify="right")
    for r in plan["configurations"]:
        if not (r["candidate"] or r["chosen"]):
            continue
        t.add_row("*" if r["chosen"] else "", str(r["n_workers"]), str(r["global_batch"]), str(r["local_batch"]),
                  _ms(r["t_step_s"]), f"{r['epoch_time_s']:.3f}", f"{r['total_time_s']:.2f}", f"{r['cost']:.4g}",
                  fmt_bytes(r["peak_mem_bytes"]), "yes" if r["feasible"] else "no",
                  style="bold green" if r["chosen"] else (None if r["feasible"] else "dim"))
    return t


def plot_plan(plan: dict, trials: list[dict], path: str | Path) -> Path:
    """Time and cost vs global batch per cluster size: predicted lines, measured points
    (time: E * D / B * measured t_step), the chosen configuration starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .perfmodel import training_time_s
    from .pricing import make_pricing
    from .spec import spec_from_dict

    spec = spec_from_dict(plan["spec"])
    pricing = make_pricing(spec.pricing)
    d, e = plan["dataset_size"], spec.epochs
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (n, curve) in enumerate(sorted(plan["curves"].items(), key=lambda kv: int(kv[0]))):
        col = colors[k % len(colors)]
        ax_t.plot(curve["global_batch"], curve["total_time_s"], "-", color=col, label=f"N={n} predicted")
        ax_c.plot(curve["global_batch"], curve["cost"], "-", color=col, label=f"N={n} predicted")
        meas = [t for t in trials if t["status"] == "ok" and t["n_workers"] == int(n)]
        if meas:
            gb = [t["global_batch"] for t in meas]
            tt = training_time_s([t["t_step_s"] for t in meas], gb, d, e)
            cc = pricing.cost(tt, int(n), [t["peak_mem_bytes"] for t in meas])
            ax_t.plot(gb, tt, "o", color=col, label=f"N={n} measured")
            ax_c.plot(gb, cc, "o", color=col)
        kn = plan["knees"].get(n)
        if kn:
            ax_t.axvline(kn["global_batch"], color=col, ls=":", lw=1)
    c = plan["choice"]
    for ax, y in ((ax_t, c["total_time_s"]), (ax_c, c["cost"])):
        ax.plot([c["global_batch"]], [y], marker="*", ms=18, color="gold", mec="black", ls="none",
                label=f"chosen: N={c['n_workers']}, B={c['global_batch']}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch B")
        ax.grid(alpha=0.3)
    ax_t.set_ylabel(f"training time for {e} epochs (s)")
    ax_c.set_ylabel(f"cost ({spec.pricing.kind} pricing, {pricing.unit})")
    ax_t.legend(fontsize=8)
    ax_c.legend(fontsize=8)
    fig.suptitle(f"{spec.name}: objective {plan['objective']} (dotted: knee per cluster size)")
    return _save_figure(fig, path)


def _save_figure(fig, path: str | Path) -> Path:
    """Lay out, write as PNG (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def train_table(run: dict) -> Table:
    """One row per epoch: loss, accuracy, time, LR and (AGS) the share of scaled steps."""
    top5 = any("test_top5" in h for h in run["history"])
    scaled = any("scaled_fraction" in h for h in run["history"])
    grows = len({(h["global_batch"], h["n_workers"]) for h in run["history"]}) > 1
    t = Table(title=f"Training: {run['method']} on N={run['n_workers']}, B={run['global_batch']} "
                    f"(b={run['local_batch']}, {run['steps_per_epoch']} steps/epoch)")
    score = epoch_score(run["history"][0])[0] if run["history"] else "top-1"
    cols = ["epoch"] + (["B", "N", "updates"] if grows else []) + ["train loss", "test loss", score] + \
        (["top-5"] if top5 else []) + ["epoch s", "lr"] + (["scaled steps"] if scaled else [])
    for col in cols:
        t.add_column(col, justify="right")
    for h in run["history"]:
        row = [str(h["epoch"])] + ([str(h["global_batch"]), str(h["n_workers"]), str(h["steps_done"])] if grows
                                   else []) + [f"{h['train_loss']:.4f}", f"{h['test_loss']:.4f}", epoch_score(h)[2]]
        row += [f"{h['test_top5']:.2%}"] if top5 else []
        row += [f"{h['epoch_time_s']:.2f}", f"{h['lr']:.4g}"]
        row += [f"{h.get('scaled_fraction', 0):.0%}"] if scaled else []
        t.add_row(*row)
    return t


def plot_training(run: dict, path: str | Path) -> Path:
    """Test accuracy and training loss per epoch; for AGS and static scaling also the
    gradient variability Δ(G) per step with scaled and unscaled steps marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tr = run.get("traces") or {}
    has_delta = bool(tr.get("delta"))
    grows = len({(h["global_batch"], h["n_workers"]) for h in run["history"]}) > 1
    noise = [h.get("b_simple") for h in run["history"]]
    grows = grows or any(b is not None for b in noise)  # the batch panel also shows B_simple
    cols = 1 + has_delta + grows
    fig, axes = plt.subplots(1, cols, figsize=(6 * cols, 4.4), squeeze=False)
    if grows:  # the batch schedule: global batch and workers per epoch
        axg = axes[0, cols - 1]
        ep = [h["epoch"] for h in run["history"]]
        axg.step(ep, [h["global_batch"] for h in run["history"]], where="mid", label="global batch B")
        if any(b is not None for b in noise):
            axg.plot(ep, [float("nan") if b is None else b for b in noise], "o:", color="tab:green", ms=4,
                     label="gradient noise scale B_simple")
        axg.set_yscale("log", base=2)
        axg.set_xlabel("epoch")
        axg.set_ylabel("global batch B")
        axw = axg.twinx()
        axw.step(ep, [h["n_workers"] for h in run["history"]], where="mid", color="tab:orange", ls="--",
                 label="workers N")
        axw.set_ylabel("workers N")
        axg.set_title(f"batch {run.get('batch_schedule') or 'constant'}: {run['steps_done']} model updates",
                      fontsize=10)
        axg.legend(loc="upper left", fontsize=8)
        axw.legend(loc="lower right", fontsize=8)
    ax = axes[0, 0]
    ep = [h["epoch"] for h in run["history"]]
    score = epoch_score(run["history"][0])[0] if run["history"] else "top-1"
    ax.plot(ep, [epoch_score(h)[1] for h in run["history"]], "o-", label=f"test {score}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test top-1 accuracy" if score == "top-1" else f"test {score}")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(ep, [h["train_loss"] for h in run["history"]], "s--", color="tab:red", alpha=0.7, label="train loss")
    ax2.set_ylabel("train loss")
    for f in run.get("fallbacks", []):
        ax.axvline(f["at_epoch"] + 0.5, color="grey", ls=":", lw=1)
    ax.legend(loc="lower right", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{run['method']}: N={run['n_workers']}, B={run['global_batch']}")
    if has_delta:
        axd = axes[0, 1]
        d = np.array([np.nan if v is None else v for v in tr["delta"]], float)
        steps = np.arange(len(d))
        scaled = np.array(tr["scaled"], bool)
        axd.semilogy(steps[scaled], d[scaled], ".", ms=3, color="tab:green", label="scaled step")
        axd.semilogy(steps[~scaled], d[~scaled], ".", ms=3, color="tab:red", label="sensitive step (unscaled)")
        axd.axhline(tr["delta_threshold"], color="black", ls="--", lw=1, label=f"δ = {tr['delta_threshold']}")
        axd.set_xlabel("step")
        axd.set_ylabel("gradient variability Δ(G)")
        f = tr.get("factors") or {}
        extra = f", factors mean {f['mean']:.2f} [{f['min']:.2f}, {f['max']:.2f}]" if f else ""
        axd.set_title(f"{tr['scaled_fraction']:.0%} of steps scaled{extra}", fontsize=10)
        axd.legend(fontsize=8)
        axd.grid(alpha=0.3)
    return _save_figure(fig, path)
