"""The GCM-world routing study at GPU budgets on the device machine: its data and its study file.

``prepare --packs .gpu --world DIR --store STORE``: rebuild the GCM-world netCDF years from their packs
(``benchmarks/gpu_pack.py``) into DIR and write the zarr store the gcm configs read (``data.store``), from
``configs/weatherbench/gcm_dense.yaml``'s ``data`` block with ``data.sources`` pointing into DIR. Done once,
before the study's processes start (each would otherwise wait on the store's lock).

``config --study configs/studies/gcm_16x3.yaml --arms dense smoe_all_prior --out FILE [--steps N]``: the
study file with only ``--arms`` (the baseline first), variant configs as absolute paths (FILE can live
anywhere), and the device's overrides added: data.sources/data.store as prepared, ``trainer.accelerator=gpu``
(``cpu`` with ``--device cpu``), ``trainer.deterministic=false`` (``index_add_`` has no deterministic CUDA
kernel), ``data.num_workers``. Run it with ``smoe study --config FILE --out DIR --shard K/N`` in N processes;
every run logs its validation metrics to ``DIR/runs/<arm>/seed<k>/logs/version_0/metrics.csv`` as it goes.

    python -m benchmarks.gpu_study prepare --packs .gpu --world /tmp/gcm_world --store /tmp/gcm_world.zarr
    python -m benchmarks.gpu_study config --study configs/studies/gcm_16x3.yaml --arms dense smoe_all_prior \\
        --world /tmp/gcm_world --store /tmp/gcm_world.zarr --out /tmp/gcm_16x3_gpu.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from benchmarks.gpu_pack import unpack_gcm
from benchmarks.harness import Stopwatch

ROOT = Path(__file__).resolve().parents[1]
YEARS = ("gcm_5.625deg_year1.nc", "gcm_5.625deg_year2.nc")
DATA_CONFIG = ROOT / "configs" / "weatherbench" / "gcm_dense.yaml"


def sources(world: Path) -> list[str]:
    return [str(world / name) for name in YEARS]


def prepare(packs: Path, world: Path, store: Path) -> None:
    """Unpack both years into ``world`` and write ``store`` as ``smoe train`` would on first use."""
    from smoeweather.config import read_config
    from smoeweather.training.stores import ensure_store

    watch = Stopwatch()
    for k, name in enumerate(YEARS, 1):
        pack = packs / f"gcm_year{k}.pack"
        if not pack.is_file():
            raise FileNotFoundError(f"{pack} does not exist: run `bash benchmarks/gpu_measure.sh prepare` here and "
                                    "carry .gpu")
        if not (world / name).exists():
            print(f"{world / name}: {unpack_gcm(pack, world / name)}", flush=True)
    data = read_config(DATA_CONFIG)["data"] | {"sources": sources(world), "store": str(store)}
    ensure_store(data)
    print(f"store {store} ready after {watch.elapsed():.0f} s", flush=True)


def study_file(study: Path, arms: list[str], world: Path, store: Path, out: Path, steps: int | None,
               device: str, workers: int) -> dict:
    """Write the device's version of ``study`` to ``out``; returns it."""
    raw = yaml.safe_load(study.read_text())
    unknown = [a for a in arms if a not in raw["variants"]]
    if unknown:
        raise ValueError(f"--arms {unknown} are not variants of {study} ({', '.join(raw['variants'])})")
    baseline = raw["baseline"]
    keep = [baseline] + [a for a in arms if a != baseline]
    raw["variants"] = {a: {**raw["variants"][a],
                           "config": str((study.parent / raw["variants"][a]["config"]).resolve())} for a in keep}
    if steps:
        raw["steps"] = steps
        every = int(raw.get("val_every_steps") or steps)
        raw["val_every_steps"] = every if steps % every == 0 else steps
    src = "[" + ", ".join(sources(world)) + "]"
    raw["overrides"] = [o for o in raw.get("overrides") or [] if not o.startswith(("trainer.accelerator",
                                                                                     "trainer.deterministic",
                                                                                     "data.num_workers"))]
    raw["overrides"] += [f"data.sources={src}", f"data.store={store}", f"data.num_workers={workers}",
                         f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}", "trainer.deterministic=false"]
    raw["name"] = f"{raw.get('name', study.stem)}_gpu"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="unpack the GCM world and write its store")
    c = sub.add_parser("config", help="write the device's study file")
    for q in (p, c):
        q.add_argument("--world", type=Path, default=Path("/tmp/gcm_world"), help="folder of the netCDF years")
        q.add_argument("--store", type=Path, default=Path("/tmp/gcm_world.zarr"), help="the zarr store")
    p.add_argument("--packs", type=Path, default=ROOT / ".gpu", help="folder of gcm_year1.pack, gcm_year2.pack")
    c.add_argument("--study", type=Path, required=True)
    c.add_argument("--arms", nargs="+", required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--steps", type=int, default=None, help="override the study's steps (e.g. 2 for a dry run)")
    c.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    c.add_argument("--workers", type=int, default=2, help="data.num_workers per process")
    args = parser.parse_args()
    if args.verb == "prepare":
        prepare(args.packs, args.world, args.store)
    else:
        if not args.study.is_file():
            parser.error(f"--study {args.study} does not exist")
        study_file(args.study, args.arms, args.world, args.store, args.out, args.steps, args.device, args.workers)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
