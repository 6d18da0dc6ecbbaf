"""``python -m sim``: seeded sweeps, replays and the determinism self-check.

python -m sim --seeds 200 [--start 0] [--scenario all|kv|alarms|queues]
              [--faults all|none|crash,power,fsync,calls,alarms,buggify,store] [--bug NAME]
              [--check-determinism]
python -m sim replay SEED [--scenario NAME] [--faults ...] [--bug NAME] [--all]
                         [--schedule JSON] [--shrink [RUNS]]
python -m sim hash SEED [--scenario NAME] [--faults ...] [--bug NAME]
python -m sim selfcheck SEED [--scenario NAME] [--faults ...] [--bug NAME]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .fault_schedule import FaultSchedule
from .faults import ALL_FAULTS, FAULT_KINDS, parse_faults
from .report import around
from .runner import SeedResult, replay_command
from .scenarios import SCENARIOS, run_seed, scenario_of_bug
from .shrinking import shrink_runs

try:  # the cluster needs the package's cluster extra (psycopg)
    from .cluster import CLUSTER_BUGS
except ImportError:  # pragma: no cover - without the extra, only single hosts
    CLUSTER_BUGS = {}

_ROOT = Path(__file__).resolve().parent.parent
_ALL_BUGS = sorted(
    {b for scenario in SCENARIOS.values() for b in scenario.bugs} | set(CLUSTER_BUGS)
)


def _common_args(parser: argparse.ArgumentParser, many: bool) -> None:
    names = ["all", *SCENARIOS] if many else list(SCENARIOS)
    parser.add_argument(
        "--scenario",
        choices=names,
        default=None,
        help=f"which scenario (default: {'all' if many else 'kv'}, or the bug's)",
    )
    parser.add_argument(
        "--faults",
        type=parse_faults,
        default=ALL_FAULTS,
        help=f"all, none, or a comma-separated subset of {','.join(FAULT_KINDS)} (default all)",
    )
    parser.add_argument("--bug", choices=_ALL_BUGS, help="run against a planted bug")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a simulated cluster of 1 to 5 hosts (drawn from the seed) over the "
        "simulated store and network, with the cluster's faults",
    )


def _scenarios(args: argparse.Namespace, many: bool) -> list[str]:
    if args.bug in CLUSTER_BUGS:
        if not args.cluster:
            raise SystemExit(f"--bug {args.bug} is a cluster's: add --cluster")
        if args.scenario in (None, "all"):
            return list(SCENARIOS) if many and args.scenario == "all" else ["kv"]
        return [args.scenario]
    if args.bug is not None:
        owners = [name for name, s in SCENARIOS.items() if args.bug in s.bugs]
        if args.scenario in (None, "all"):
            # A runtime bug (sim/bugs.py) is every scenario's: one run checks the first.
            return owners if many and args.scenario == "all" else [scenario_of_bug(args.bug)]
        if args.scenario not in owners:
            raise SystemExit(f"--bug {args.bug} belongs to the {owners[0]} scenario")
        return [args.scenario]
    if args.scenario in (None, "all"):
        return list(SCENARIOS) if many else ["kv"]
    return [args.scenario]


_ONE_SEED = """one seed (each takes --scenario, --faults, --bug and --cluster as above):
  python -m sim replay SEED [--all]   run it and print the history around what it broke;
                                      --shrink: first shrink its faults to a few that still
                                      break the same invariants; --schedule JSON: exactly
                                      these faults (one host)
  python -m sim hash SEED             print its trace hash
  python -m sim selfcheck SEED        run it twice, and once more under another
                                      PYTHONHASHSEED: the same trace hash each time"""


def sweep(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim",
        description="Run seeded scenarios.",
        epilog=_ONE_SEED,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds (default 200)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--check-determinism",
        action="store_true",
        help="also replay the first seed in a subprocess with another PYTHONHASHSEED",
    )
    _common_args(parser, many=True)
    args = parser.parse_args(argv)
    ok = True
    for scenario in _scenarios(args, many=True):
        started = time.perf_counter()
        failed = ops = 0
        for seed in range(args.start, args.start + args.seeds):
            result = run_seed(scenario, seed, args.bug, args.faults, args.cluster)
            ops += result.ops
            if not result.ok:
                failed += 1
                print(
                    f"{scenario} seed {seed}: FAILED ({result.ops} ops, {result.crashes} crashes)"
                )
                for v in result.violations[:5]:
                    print(f"  {v}")
                if len(result.violations) > 5:
                    print(f"  ... and {len(result.violations) - 5} more")
                replay = replay_command(seed, args.bug, scenario, args.faults, args.cluster)
                print(f"  replay: {replay}")
        elapsed = time.perf_counter() - started
        print(
            f"{scenario}: {args.seeds} seeds ({args.start}..{args.start + args.seeds - 1}), "
            f"{failed} failed, {ops} operations checked ({ops / max(args.seeds, 1):.0f}/seed), "
            f"{elapsed:.1f} s ({args.seeds / elapsed:.1f} seeds/s)"
        )
        ok = ok and not failed
        if args.check_determinism and not selfcheck(
            scenario, args.start, args.bug, args.faults, args.cluster
        ):
            ok = False
    return 0 if ok else 1


def _flags(
    scenario: str, bug: str | None, faults: frozenset[str], cluster: bool = False
) -> list[str]:
    out = ["--scenario", scenario, *(["--cluster"] if cluster else [])]
    if faults != ALL_FAULTS:
        out += ["--faults", ",".join(sorted(faults)) or "none"]
    return out + (["--bug", bug] if bug else [])


def selfcheck(
    scenario: str,
    seed: int,
    bug: str | None = None,
    faults: frozenset[str] = ALL_FAULTS,
    cluster: bool = False,
) -> bool:
    """Run ``seed`` twice here and once in a subprocess with another PYTHONHASHSEED."""
    first = run_seed(scenario, seed, bug, faults, cluster).trace_hash
    second = run_seed(scenario, seed, bug, faults, cluster).trace_hash
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = str((int(env.get("PYTHONHASHSEED", "0") or 0) + 12345) % 4294967295)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "sim", "hash", str(seed), *_flags(scenario, bug, faults, cluster)]
    other = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.strip()
    same = first == second == other
    print(
        f"determinism self-check, {scenario} seed {seed}: {'ok' if same else 'MISMATCH'} "
        f"(here {first[:16]}, again {second[:16]}, "
        f"PYTHONHASHSEED={env['PYTHONHASHSEED']} {other[:16]})"
    )
    return same


def print_replay(result: SeedResult, everything: bool, out: list[str]) -> None:
    """The scenario, its violations, and the history around the first one."""
    history = result.history
    out.append(f"seed {result.seed}: {result.summary}")
    out.append(f"trace hash {result.trace_hash}")
    out.append(f"{result.ops} operations {result.counts}, {result.crashes} crashes")
    if result.ok:
        out.append("no invariant is broken")
    for v in result.violations[:10]:
        out.append(f"VIOLATION {v}")
    if len(result.violations) > 10:
        by_kind: dict[str, int] = {}
        for v in result.violations:
            by_kind[v.invariant] = by_kind.get(v.invariant, 0) + 1
        out.append(f"... {len(result.violations)} violations in all: {by_kind}")
    if everything or result.ok:
        out.extend(history.lines())
        return
    out.append("")
    first = result.violations[0]
    out.extend(around(history, first.ops, first.entries))


def _schedule(text: str) -> FaultSchedule:
    try:
        return FaultSchedule.from_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shrunk_replay(
    scenario: str, args: argparse.Namespace, result: SeedResult, out: list[str]
) -> SeedResult:
    """Shrink ``result``'s faults to a schedule that still breaks the same invariants; say
    what it is and how to replay it, and return its run."""
    broken = {v.invariant for v in result.violations}
    shrunk, best = shrink_runs(
        result.schedule,
        result,
        lambda candidate: run_seed(scenario, args.seed, args.bug, args.faults, False, candidate),
        lambda run: {v.invariant for v in run.violations} == broken,
        args.shrink,
    )
    text = shrunk.schedule.to_text()
    out.append(f"its faults: {result.schedule.summary()}")
    out.append(f"shrunk: {shrunk.report()}")
    out.extend(f"  {line}" for line in shrunk.schedule.lines())
    command = replay_command(args.seed, args.bug, scenario, args.faults)
    out.append(f"replay the shrunk schedule: {command} --schedule '{text}'")
    out.append("")
    return best


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("replay", "hash", "selfcheck"):
        parser = argparse.ArgumentParser(prog=f"python -m sim {argv[0]}")
        parser.add_argument("seed", type=int)
        _common_args(parser, many=False)
        if argv[0] == "replay":
            parser.add_argument("--all", action="store_true", help="print the whole history")
            parser.add_argument(
                "--schedule",
                type=_schedule,
                help="inject exactly these faults (a shrunk schedule, as printed)",
            )
            parser.add_argument(
                "--shrink",
                type=int,
                nargs="?",
                const=100,
                default=0,
                metavar="RUNS",
                help="shrink a failure's faults first, in at most RUNS runs (default 100)",
            )
        args = parser.parse_args(argv[1:])
        (scenario,) = _scenarios(args, many=False)
        if argv[0] == "hash":
            print(run_seed(scenario, args.seed, args.bug, args.faults, args.cluster).trace_hash)
            return 0
        if argv[0] == "selfcheck":
            ok = selfcheck(scenario, args.seed, args.bug, args.faults, args.cluster)
            return 0 if ok else 1
        if args.cluster and (args.schedule is not None or args.shrink):
            parser.error("--schedule and --shrink are for one host (not with --cluster)")
        out: list[str] = []
        result = run_seed(scenario, args.seed, args.bug, args.faults, args.cluster, args.schedule)
        if args.shrink and not result.ok:
            result = shrunk_replay(scenario, args, result, out)
        print_replay(result, args.all, out)
        print("\n".join(out))
        return 0 if result.ok else 1
    return sweep(argv)


if __name__ == "__main__":
    sys.exit(main())
