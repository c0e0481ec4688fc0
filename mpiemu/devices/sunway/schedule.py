"""SwFormer inter-op scheduling on the 6 CGs: intra-op, OPT2 and KA (SWF App. A.2, C).

An op is a set of tasks, each of which runs on one CG (GEMM tiles, attention heads); a GEMM
may offer several pad-free tilings. Ops that share one task queue form a group; a group starts
when its dependencies are done and the previous group has drained (the queue is a barrier),
and its tasks are list-scheduled longest first onto the earliest free CG. `intra` runs every
op alone with its best tiling; `opt2` pairs two independent GEMMs and searches both tilings
jointly (O(m n1^2)); `ka` fills the idle CGs of each attention op with independent ops found
by a breadth-first search over the graph, each traversed once (O(m n1)).
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

POLICIES = ("intra", "opt2", "ka")


@dataclass(frozen=True)
class Option:
    """One way to run an op: the duration of each of its tasks on one CG."""

    label: str
    tasks: tuple[float, ...]


@dataclass(frozen=True)
class Op:
    """A node of a layer's op graph; `options[0]` is its best standalone (intra-op) choice."""

    name: str
    kind: str                             # "gemm", "attention" or "other"
    options: tuple[Option, ...]
    deps: tuple[str, ...] = ()
    flops: float = 0.0

    def __post_init__(self) -> None:
        if not self.options or any(not o.tasks for o in self.options):
            raise ValueError(f"op {self.name!r} needs at least one option with tasks")


@dataclass(frozen=True)
class Segment:
    """Consecutive tasks of one op on one CG."""

    op: str
    cg: int
    start: float
    end: float
    tasks: int


@dataclass(frozen=True)
class Placement:
    """Where an op ran: its span, the CGs it used and the option chosen."""

    op: str
    start: float
    end: float
    cgs: tuple[int, ...]
    option: str
    group: int


@dataclass(frozen=True)
class Schedule:
    policy: str
    makespan: float
    placements: tuple[Placement, ...]
    segments: tuple[Segment, ...] = field(repr=False)

    def op_time(self, kinds: Iterable[str], ops: Sequence[Op]) -> float:
        """Summed span of the groups holding ops of these kinds (SwFormer's "GEMM kernels")."""
        want = {o.name for o in ops if o.kind in set(kinds)}
        spans: dict[int, tuple[float, float]] = {}
        for p in self.placements:
            if p.op in want:
                lo, hi = spans.get(p.group, (p.start, p.end))
                spans[p.group] = (min(lo, p.start), max(hi, p.end))
        return sum(hi - lo for lo, hi in spans.values())


def list_schedule(jobs: Sequence[tuple[str, float]], cgs: int, t0: float
                  ) -> list[tuple[str, int, float, float]]:
    """Tasks longest first onto the earliest free CG: (op, cg, start, end)."""
    free = [(t0, c) for c in range(cgs)]
    out = []
    for op, d in sorted(jobs, key=lambda j: -j[1]):
        t, c = heapq.heappop(free)
        out.append((op, c, t, t + d))
        heapq.heappush(free, (t + d, c))
    return out


def _group_end(choice: dict[str, Option], cgs: int) -> float:
    jobs = [(name, d) for name, opt in choice.items() for d in opt.tasks]
    return max(e for *_, e in list_schedule(jobs, cgs, 0.0))


def _ancestors(ops: dict[str, Op]) -> dict[str, set[str]]:
    memo: dict[str, set[str]] = {}

    def anc(n: str) -> set[str]:
        if n not in memo:
            memo[n] = set()
            for d in ops[n].deps:
                memo[n] |= {d} | anc(d)
        return memo[n]

    for n in ops:
        anc(n)
    return memo


def _check(ops: Sequence[Op]) -> dict[str, Op]:
    by = {o.name: o for o in ops}
    if len(by) != len(ops):
        raise ValueError("op names must be unique")
    done: set[str] = set()
    for o in ops:
        missing = [d for d in o.deps if d not in done]
        if missing:
            raise ValueError(f"op {o.name!r} depends on {missing}, which are not earlier ops")
        done.add(o.name)
    return by


def _independent(a: str, b: str, anc: dict[str, set[str]]) -> bool:
    return a not in anc[b] and b not in anc[a]


def _opt2_groups(ops: Sequence[Op], anc: dict[str, set[str]], cgs: int
                 ) -> list[dict[str, Option]]:
    """Pair each GEMM with the next independent GEMM whose deps are met; joint tiling search."""
    by = {o.name: o for o in ops}
    groups: list[dict[str, Option]] = []
    placed: set[str] = set()
    for i, o in enumerate(ops):
        if o.name in placed:
            continue
        placed.add(o.name)
        partner = None
        if o.kind == "gemm":
            partner = next((p for p in ops[i + 1:] if p.kind == "gemm" and p.name not in placed
                            and _independent(o.name, p.name, anc)
                            and anc[p.name] <= placed), None)
        if partner is None:
            groups.append({o.name: o.options[0]})
            continue
        placed.add(partner.name)
        best = min(((a, b) for a in o.options for b in by[partner.name].options),
                   key=lambda ab: _group_end({o.name: ab[0], partner.name: ab[1]}, cgs))
        groups.append({o.name: best[0], partner.name: best[1]})
    return groups


def _bfs(start: str, ops: dict[str, Op]) -> list[str]:
    """Breadth-first order of the graph from `start`, edges taken both ways."""
    nbr: dict[str, set[str]] = {n: set(o.deps) for n, o in ops.items()}
    for n, o in ops.items():
        for d in o.deps:
            nbr[d].add(n)
    seen, order, queue = {start}, [], deque([start])
    while queue:
        n = queue.popleft()
        order.append(n)
        for m in sorted(nbr[n]):
            if m not in seen:
                seen.add(m)
                queue.append(m)
    return order[1:]


def _movable(x: str, a: str, pos: dict[str, int], order: Sequence[Op],
             anc: dict[str, set[str]], moved: set[str]) -> bool:
    """Can op x join attention a's queue? Earlier x: nothing between them needs x; later
    x: all of x's ancestors run before a."""
    if pos[x] < pos[a]:
        return not any(x in anc[o.name] for o in order[pos[x] + 1:pos[a]]
                       if o.name not in moved)
    return all(pos[d] < pos[a] and d not in moved for d in anc[x])


def _ka_groups(ops: Sequence[Op], anc: dict[str, set[str]], cgs: int
               ) -> list[dict[str, Option]]:
    """Intra-op order, but each attention op takes independent ops (BFS order, each tried
    once) into its queue when that saves time: their tiles fill the CGs its heads leave idle."""
    by = {o.name: o for o in ops}
    pos = {o.name: i for i, o in enumerate(ops)}
    fills: dict[str, dict[str, Option]] = {}
    moved: set[str] = set()
    for a in (o for o in ops if o.kind == "attention"):
        group = {a.name: a.options[0]}
        for cand in _bfs(a.name, by):
            c = by[cand]
            if (cand in moved or c.kind == "attention" or not _independent(a.name, cand, anc)
                    or not _movable(cand, a.name, pos, ops, anc, moved)):
                continue
            base = _group_end(group, cgs)
            alone = _group_end({cand: c.options[0]}, cgs)
            best = min(c.options, key=lambda op: _group_end({**group, cand: op}, cgs))
            if _group_end({**group, cand: best}, cgs) - base < alone:
                group[cand] = best
                moved.add(cand)
        fills[a.name] = group
    return [fills.get(o.name, {o.name: o.options[0]}) for o in ops if o.name not in moved]


def schedule(ops: Sequence[Op], cgs: int = 6, policy: str = "intra") -> Schedule:
    """Place every op's tasks on the CGs under a policy; ops must be in a topological order."""
    if policy not in POLICIES:
        raise ValueError(f"schedule policy={policy!r}; choose one of {list(POLICIES)}")
    by = _check(ops)
    anc = _ancestors(by)
    if policy == "opt2":
        groups = _opt2_groups(ops, anc, cgs)
    elif policy == "ka":
        groups = _ka_groups(ops, anc, cgs)
    else:
        groups = [{o.name: o.options[0]} for o in ops]
    return _run_groups(groups, cgs, policy)


def _run_groups(groups: list[dict[str, Option]], cgs: int, policy: str) -> Schedule:
    t = 0.0
    placements: list[Placement] = []
    segments: list[Segment] = []
    for gi, group in enumerate(groups):
        jobs = [(name, d) for name, opt in group.items() for d in opt.tasks]
        runs = list_schedule(jobs, cgs, t)
        for name, opt in group.items():
            mine = sorted((c, s, e) for op, c, s, e in runs if op == name)
            placements.append(Placement(name, min(s for _, s, _ in mine),
                                        max(e for *_, e in mine),
                                        tuple(sorted({c for c, _, _ in mine})), opt.label, gi))
            segments += _segments(name, mine)
        t = max(e for *_, e in runs)
    return Schedule(policy, t, tuple(placements), tuple(segments))


def _segments(name: str, runs: list[tuple[int, float, float]]) -> list[Segment]:
    """Merge back-to-back tasks of one op on one CG into one segment."""
    out: list[Segment] = []
    for c, s, e in runs:
        last = out[-1] if out else None
        if last and last.cg == c and abs(last.end - s) <= 1e-12 * max(1.0, s):
            out[-1] = Segment(name, c, last.start, e, last.tasks + 1)
        else:
            out.append(Segment(name, c, s, e, 1))
    return out
