"""`cbbench reproduce --jobs N`: simulated replicates over N worker processes
(reproduce.run_replicates' loop, the same rows in seed order; progress by replicate)."""

from __future__ import annotations

from collections.abc import Callable

from cbbench.harness.studies import reproduce as rp


def run_replicates(
    workload: str,
    s: rp.Setting,
    wrap_executor: Callable | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    on_result: Callable[[dict, tuple], None] | None = None,
    jobs: int = 1,
) -> dict:
    """reproduce.run_replicates, its simulated replicates over `jobs` processes when > 1
    (the same rows, in seed order)."""
    if jobs > 1 and s.executor == "sim" and wrap_executor is None and s.replicates > 1:
        reps = parallel_replicates(workload, s, jobs, on_progress, on_result)
        return rp.replicates_summary(workload, s, reps)
    return rp.run_replicates(workload, s, wrap_executor, on_progress, on_result)


def pair_job(workload: str, s: rp.Setting, seed: int, keep: bool) -> dict:
    """run_pair in a worker process (--jobs): the results travel back only when kept."""
    row = rp.run_pair(workload, s, seed)
    if not keep:
        row.pop("results")
    return row


def parallel_replicates(
    workload: str,
    s: rp.Setting,
    jobs: int,
    on_progress: Callable[[int, int], None] | None,
    on_result: Callable[[dict, tuple], None] | None,
) -> list[dict]:
    """run_replicates' loop over `jobs` processes: unique request sets only, rows in seed
    order; progress by finished replicate."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    total = 2 * s.num_requests * s.replicates
    first: dict[tuple, int] = {}  # request set -> the first seed that has it
    seeds = [s.seed + i for i in range(s.replicates)]
    for seed in seeds:
        wl_reqs = rp.scaled(rp._requests(workload, seed, s.num_requests), s.length_scale)
        first.setdefault(tuple((r.prompt_len, r.output_len) for r in wl_reqs), seed)
    unique = sorted(first.values())
    rows: dict[int, dict] = {}
    done = 0
    with ProcessPoolExecutor(max_workers=min(jobs, len(unique))) as pool:
        futs = {pool.submit(pair_job, workload, s, seed, on_result is not None): seed
                for seed in unique}  # fmt: skip
        for fut in as_completed(futs):
            row = fut.result()
            if on_result is not None:
                on_result(row, row.pop("results"))
            rows[futs[fut]] = row
            done += 2 * s.num_requests * sum(1 for v in first.values() if v == futs[fut])
            if on_progress is not None:
                on_progress(min(done, total), total)
    by_set = {k: rows[v] for k, v in first.items()}
    out = []
    for seed in seeds:
        wl_reqs = rp.scaled(rp._requests(workload, seed, s.num_requests), s.length_scale)
        row = by_set[tuple((r.prompt_len, r.output_len) for r in wl_reqs)]
        out.append(row if row["seed"] == seed else
                   {**row, "seed": seed, "same_requests_as_seed": row["seed"]})  # fmt: skip
    if on_progress is not None:
        on_progress(total, total)
    return out
