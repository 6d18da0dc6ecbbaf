"""``python -m sim``: seeded sweeps, replays and the determinism self-check.

python -m sim --seeds 200 [--start 0] [--bug NAME] [--check-determinism]
python -m sim replay SEED [--bug NAME] [--all]
python -m sim hash SEED [--bug NAME]
python -m sim selfcheck SEED [--bug NAME]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .bugs import BUGS
from .history import History
from .scenario import SeedResult, replay_command, run_kv_seed

_ROOT = Path(__file__).resolve().parent.parent


def _bug_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bug", choices=sorted(BUGS), help="run against a planted bug")


def sweep(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description="Run seeded scenarios.")
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds (default 200)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--check-determinism",
        action="store_true",
        help="also replay the first seed in a subprocess with another PYTHONHASHSEED",
    )
    _bug_arg(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    failed = ops = 0
    for seed in range(args.start, args.start + args.seeds):
        result = run_kv_seed(seed, args.bug)
        ops += result.ops
        if not result.ok:
            failed += 1
            print(f"seed {seed}: FAILED ({result.ops} ops, {result.crashes} crashes)")
            for v in result.violations[:5]:
                print(f"  {v}")
            if len(result.violations) > 5:
                print(f"  ... and {len(result.violations) - 5} more")
            print(f"  replay: {replay_command(seed, args.bug)}")
    elapsed = time.perf_counter() - started
    print(
        f"{args.seeds} seeds ({args.start}..{args.start + args.seeds - 1}), {failed} failed, "
        f"{ops} operations checked ({ops / max(args.seeds, 1):.0f}/seed), "
        f"{elapsed:.1f} s ({args.seeds / elapsed:.1f} seeds/s)"
    )
    if args.check_determinism and not selfcheck(args.start, args.bug):
        return 1
    return 1 if failed else 0


def seed_hash(seed: int, bug: str | None) -> str:
    return run_kv_seed(seed, bug).trace_hash


def selfcheck(seed: int, bug: str | None = None) -> bool:
    """Run ``seed`` twice here and once in a subprocess with another PYTHONHASHSEED."""
    first = seed_hash(seed, bug)
    second = seed_hash(seed, bug)
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = str((int(env.get("PYTHONHASHSEED", "0") or 0) + 12345) % 4294967295)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "sim", "hash", str(seed)] + (["--bug", bug] if bug else [])
    other = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.strip()
    same = first == second == other
    print(
        f"determinism self-check, seed {seed}: {'ok' if same else 'MISMATCH'} "
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
    out.extend(_around(history, result.violations[0].ops))


def _around(history: History, op_ids: Sequence[int], context: int = 6) -> list[str]:
    """Entries of the violation's keys and every fault, from a little before its first
    operation to a little after its last."""
    ops = [history.ops[i] for i in op_ids]
    keys: set[bytes] = {op.args["key"] for op in ops if "key" in op.args}
    indexes = [op.invoke_index for op in ops] + [
        int(op.complete_index) for op in ops if op.complete_index != float("inf")
    ]
    lo, hi = min(indexes) - context, max(indexes) + context
    lines = [f"history entries {max(lo, 0)}..{hi} about keys {sorted(keys)} (>> marks the ops):"]
    for entry in history.entries:
        if not lo <= entry.index <= hi:
            continue
        op = entry.op
        if op is not None and keys and op.args.get("key") not in keys and op.kind != "kv.list":
            continue
        mark = ">>" if op is not None and op.id in op_ids else "  "
        lines.append(f"{mark} {history.line(entry)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("replay", "hash", "selfcheck"):
        parser = argparse.ArgumentParser(prog=f"python -m sim {argv[0]}")
        parser.add_argument("seed", type=int)
        _bug_arg(parser)
        if argv[0] == "replay":
            parser.add_argument("--all", action="store_true", help="print the whole history")
        args = parser.parse_args(argv[1:])
        if argv[0] == "hash":
            print(seed_hash(args.seed, args.bug))
            return 0
        if argv[0] == "selfcheck":
            return 0 if selfcheck(args.seed, args.bug) else 1
        out: list[str] = []
        result = run_kv_seed(args.seed, args.bug)
        print_replay(result, args.all, out)
        print("\n".join(out))
        return 0 if result.ok else 1
    return sweep(argv)


if __name__ == "__main__":
    sys.exit(main())
