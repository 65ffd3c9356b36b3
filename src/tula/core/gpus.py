"""One rank per GPU: which GPU a rank gets, and which worlds cannot be placed.

The rule, for every launcher: the ranks on one host are numbered by their *local rank*
(0 .. ranks on that host - 1), and local rank r uses GPU r of the GPUs visible on that host
(``CUDA_VISIBLE_DEVICES`` respected: ``torch.cuda.device_count()`` counts only those, and
index r is the r-th of them).  The local launcher's rank r is local rank r; Dask, torchrun,
srun and mpirun ranks use the local rank their launcher gives them.  Two ranks never share a
GPU: a world with more ranks on a host than that host has GPUs is refused before any rank
starts (NCCL would otherwise fail after its rendezvous with "invalid usage").  On CPU there
is no such limit (``visible_gpus`` None).

Pure rules: no torch here (the engine reads the counts and passes them in).
"""

from __future__ import annotations

from tula.core.errors import PlacementError


def too_many_ranks_sentence(ranks_on_host: int, visible_gpus: int, where: str = "this host") -> str:
    """One sentence: ``ranks_on_host`` ranks cannot each have a GPU of the ``visible_gpus`` on
    ``where``."""
    gpus = f"{visible_gpus} GPU" + ("" if visible_gpus == 1 else "s")
    visible = "no GPU" if visible_gpus == 0 else gpus
    return (
        f"{ranks_on_host} ranks on {where}, which has {visible} visible (CUDA_VISIBLE_DEVICES respected): "
        f"each rank needs a GPU of its own; use at most {visible_gpus} rank{'' if visible_gpus == 1 else 's'} per host"
        + (", or train on the CPU (cluster.device: cpu)" if visible_gpus == 0 else "")
    )


def check_ranks_fit(ranks_on_host: int, visible_gpus: int | None, where: str = "this host") -> None:
    """Raise :class:`~tula.core.errors.PlacementError` when ``ranks_on_host`` ranks on one
    host do not each get a GPU of its own (``visible_gpus`` None: CPU ranks, no limit)."""
    if visible_gpus is not None and ranks_on_host > visible_gpus:
        raise PlacementError(too_many_ranks_sentence(ranks_on_host, visible_gpus, where))


def gpu_for_rank(local_rank: int, ranks_on_host: int, visible_gpus: int) -> int:
    """The index (among the visible GPUs) of the GPU of the rank at ``local_rank`` on a host
    running ``ranks_on_host`` ranks: ``local_rank`` itself.  Raises
    :class:`~tula.core.errors.PlacementError` when the host's ranks outnumber its GPUs."""
    if not 0 <= local_rank < max(ranks_on_host, 1):
        raise ValueError(f"local rank {local_rank} is not one of {ranks_on_host} ranks on its host")
    check_ranks_fit(ranks_on_host, visible_gpus)
    return local_rank


def crowded_hosts(ranks_per_host: dict[str, int], gpus_per_host: dict[str, int | None]) -> list[str]:
    """One sentence per host that has more ranks than GPUs (hosts missing from
    ``gpus_per_host``, or with None there, have no limit); empty when every rank has a GPU."""
    out = []
    for host, ranks in sorted(ranks_per_host.items()):
        gpus = gpus_per_host.get(host)
        if gpus is not None and ranks > gpus:
            out.append(too_many_ranks_sentence(ranks, gpus, f"host {host}"))
    return out


def unplaceable_sizes(cluster_sizes: list[int] | tuple[int, ...], gpus_per_host: int | None) -> list[int]:
    """The cluster sizes a launcher that places every rank on one host (the local launcher)
    cannot run: N above the host's ``gpus_per_host`` (None: CPU, none)."""
    if gpus_per_host is None:
        return []
    return [n for n in cluster_sizes if n > gpus_per_host]


def unplaced_note(sizes: list[int], gpus_per_host: int) -> str:
    """Why the profile did not run ``sizes``: a trial's note and the plan's reason."""
    gpus = f"{gpus_per_host} GPU" + ("" if gpus_per_host == 1 else "s")
    return (
        f"not measured: N = {', '.join(map(str, sizes))} would put more than one rank on a GPU "
        f"(the local launcher's host has {gpus}, and each rank needs its own)"
    )
