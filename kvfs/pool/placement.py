"""Placement: where a new block's stripe units go. Each namespace's share follows its weight
times a learned balance (adaptive placement: every namespace should finish its share of a block
at the same time), blocks start on namespaces in rotation, and failed namespaces get no new
units while a healthy one has room. A part of `Pool` (kvfs/pool/pool.py), whose namespaces,
free-space maps and balance it uses."""

from __future__ import annotations

from kvfs.errors import DeviceError, KvfsError, no_space
from kvfs.pool.layout import place_units, stored_length, unit_count

OBSERVE_UNITS = 128  # units moved between two updates of the placement balance, at least
OBSERVE_SECONDS = 1.0  # and the time they span, at least (see `observe`)


class Placement:
    def placement_weights(self) -> list[float]:
        """Each namespace's share of a new block's units.

        The configured weight times, with adaptive placement, a learned balance factor that
        makes every namespace finish its share of a block at the same time (see `observe`), so a
        slower namespace gets proportionally fewer units and does not hold every block back.
        Failed namespaces get no new units (unless all have failed), until they are on
        probation (`Namespace.on_probation`: no error for a while); removed ones none.
        """
        nss = self.namespaces
        healthy = [ns.stats.state == "ok" or ns.on_probation() for ns in nss]
        if not any(healthy):
            healthy = [not ns.removed for ns in nss]  # (removed: never)
        return [ns.weight * b if ok else 0.0 for ns, b, ok in zip(nss, self.balance, healthy)]

    def observe(self, units: dict[int, int], start: float, seconds: dict[int, float]) -> None:
        """Learn from one striped transfer that began at `start` (time.perf_counter):
        namespace j moved `units[j]` units in `seconds[j]` (from `start` to its last unit on j).

        What is learned is each namespace's busy time per unit, as iostat's service time:
        the time it had I/O in flight, however many of them at once, over the units it
        moved. The part of a transfer's span that overlaps one already counted (transfers
        side by side on the same namespace: units written behind, readers, the flusher) is
        not counted again. Per-I/O latency would not do: it includes the wait behind the
        namespace's other I/Os, so the namespace given more units looks slower per unit and
        the one given fewer looks faster, and the balance swung (a namespace at a quarter of
        the others' bandwidth, on one busy CPU, ended above them).

        Transfers are pooled until OBSERVE_UNITS units have moved over OBSERVE_SECONDS at least
        (single transfers are noisy: devices burst after idling, and a cgroup throttle lets
        I/O through in 100 ms slices; updated every 128 units, a third of a second there, the
        weights of four equal devices wandered between 0.73 and 1.0, one namespace given 60
        of a round's 192 units, and every load of those blocks waited for it). Then each
        namespace's time per unit predicts how long it would take for a block laid out with
        today's weights, and the factors move a geometric quarter step towards equal predicted
        times (a half step followed what the mount's transfers measured from one second to the
        next: in bench/clients.py, weights of equal devices as far apart as 0.35 to 1.0).
        Whatever makes a namespace slower (its link, its load, a throttle), this feedback
        balances it; a factor stays within [1/50, 1].
        """
        if not self.adaptive:
            return
        if not any(self._obs_units):
            self._obs_since = start
        for j, u in units.items():
            s = seconds.get(j, 0)
            if u > 0 and s > 0:
                end = start + s
                self._obs_units[j] += u
                self._obs_seconds[j] += max(0.0, end - max(start, self._busy_until[j]))
                self._busy_until[j] = max(self._busy_until[j], end)
        if (
            sum(self._obs_units) < OBSERVE_UNITS
            or max(self._busy_until) - self._obs_since < OBSERVE_SECONDS
        ):
            return
        weights = self.placement_weights()
        predicted = {
            j: weights[j] * self._obs_seconds[j] / self._obs_units[j]
            for j in range(len(self.namespaces))
            if self._obs_units[j] > 0 and self._obs_seconds[j] > 0 and weights[j] > 0
        }
        self._obs_units = [0] * len(self.namespaces)
        self._obs_seconds = [0.0] * len(self.namespaces)
        if len(predicted) < 2:
            return
        mean = sum(predicted.values()) / len(predicted)
        for j, t in predicted.items():
            self.balance[j] *= (mean / t) ** 0.25
        top = max(self.balance)
        self.balance = [min(1.0, max(0.02, b / top)) for b in self.balance]

    def allocate(self, size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Choose a namespace and offset for every unit of a `size`-byte block.

        Raises ENOSPC (KvfsError) if the units do not fit; nothing is allocated then.
        """
        n = unit_count(size, self.unit)
        lengths = [stored_length(size, self.unit, k) for k in range(n)]
        weights = self.placement_weights()
        if self.area.whole:  # (free_in walks every free extent of the range)
            room = [a.free_bytes for a in self.allocators]
        else:
            room = [
                sum(a.free_in(lo, hi)[0] for lo, hi in self.area.ranges(ns.size))
                for a, ns in zip(self.allocators, self.namespaces)
            ]
        try:
            assign = list(
                place_units(
                    n, weights, self._rotation % len(self.namespaces), room, lengths, self._credit
                )
            )
        except ValueError:
            raise no_space(f"pool is full: no room for a block of {size} bytes") from None
        self.next_rotation()
        offsets = [0] * n
        taken: list[tuple[int, int, int]] = []
        try:
            for j in set(assign):
                ks = [k for k in range(n) if assign[k] == j]
                total = sum(lengths[k] for k in ks)
                off = self.alloc_extent(j, total)
                if off is not None:
                    taken.append((j, off, total))
                    for k in ks:
                        offsets[k] = off
                        off += lengths[k]
                    continue
                for k in ks:  # fragmented: one extent per unit, elsewhere if need be
                    for j2 in [j] + sorted(
                        (i for i in range(len(room)) if i != j), key=lambda i: -room[i]
                    ):
                        off = self.alloc_extent(j2, lengths[k])
                        if off is not None:
                            break
                    else:
                        raise no_space(
                            f"pool is full: no namespace has room for a "
                            f"{lengths[k]}-byte stripe unit (free space is "
                            f"fragmented)"
                        )
                    taken.append((j2, off, lengths[k]))
                    assign[k] = j2
                    offsets[k] = off
        except KvfsError:
            for j, off, length in taken:
                self.free_extent(j, off, length)
            raise
        return tuple(assign), tuple(offsets)

    def can_place_elsewhere(self, e: KvfsError) -> bool:
        """Whether a block whose write failed with `e` can be written again elsewhere: a
        namespace failed (`Namespace._failed` names it), and another is healthy."""
        return isinstance(e, DeviceError) and any(
            ns.stats.state == "ok" and ns.index != e.namespace for ns in self.namespaces
        )

    def next_rotation(self) -> int:
        """The namespace the next block starts on (rotates block by block)."""
        r = self._rotation % len(self.namespaces)
        self._rotation += 1
        return r

    def alloc_unit(self, preferred: int, length: int) -> tuple[int, int]:
        """An extent for one unit, on `preferred` if it has room and is healthy (ok, or on
        probation), else on the next healthy namespace (in order) that has; on a failed one
        only if no healthy one has room (never on a removed one: `alloc_extent`). Raises
        ENOSPC."""
        n = len(self.namespaces)
        for healthy in (True, False):
            for i in range(n):
                j = (preferred + i) % n
                ns = self.namespaces[j]
                if healthy != (ns.stats.state == "ok" or ns.on_probation()):
                    continue
                off = self.alloc_extent(j, length)
                if off is not None:
                    return j, off
        raise no_space(f"pool is full: no room for a {length}-byte stripe unit")
