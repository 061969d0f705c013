"""FedAPA's Eqs. 5-7 computed while the uploads arrive, so that closing a round is cheap.

Eq. 7's q_i^c = Σ_j α_ij^c p_j^c with α the softmax over j of cos(p_i^c, p_j^c)/τ (Eqs.
5-6) is a sum over pairs of uploads. When upload j arrives, every pair (i, j) with an
earlier i is known: its cosines, and its terms e_ij·p_j (into i's numerator) and
e_ji·p_i (into j's), where e_ij = exp((cos_ij - 1)/τ) is the stable softmax's term (a
row's largest cosine is its own, 1; see :func:`mqttfl.algorithms.fedapa.
personalized_prototypes`, the same shift). So each arrival adds O(N·C·d) work, the whole
fan-in the same O(N²·C·d) as one batched product, and closing the round is a division:
at N=100 (C=21, d=256) that moves two (C, N, N) products off the round's critical path,
into the seconds over which clients finish training. Arrivals are summed in blocks (one
product of a block against every earlier row, as BLAS likes it, not a pass over all rows
per upload), so a round's close sums at most one block.

The result equals the batched product up to float32 rounding (summation order). Each
block is summed in client order, not arrival order, so a round of up to ``BLOCK``
uploads gives the same Q_i to the bit however its uploads raced; in larger rounds the
blocks' membership, and so the last bits, still follow arrival. It is used only when the
round aggregates exactly the uploads it saw arrive, unweighted (synchronous rounds,
:meth:`FanIn.covers`); otherwise the batched path runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mqttfl.algorithms.common.prototype_uploads import PrototypeUpload
from mqttfl.wire.schemas import Body

START_ROWS = 16
# Rows summed together: at least 16, and an eighth of those before them, so that the
# fan-in makes O(log N) thin passes over the earlier rows at large N (its CPU stays near
# the batched product's) while a round's close sums at most that one block.
BLOCK = 16


class FanIn:
    """One round's uploads as they arrive, with Eqs. 5-7's pair sums kept up to date."""

    def __init__(self, t: int, num_classes: int, dim: int, tau: float) -> None:
        self.t, self.tau = t, tau
        self.rows: dict[str, int] = {}
        self.bodies: list[PrototypeUpload] = []
        c, n = num_classes, START_ROWS
        self.per_class = np.zeros((c, n, dim), np.float32)  # p_j^c, zero where not held
        self.held = np.zeros((n, c), bool)
        self.unit = np.zeros((c, n, dim), np.float32)  # p_j^c / |p_j^c|, zero where not held
        self.own = np.zeros((c, n), np.float32)  # u_j·u_j: 1, or 0 for a zero vector
        self.numerator = np.zeros((c, n, dim), np.float32)  # Σ_j e_ij·[j holds c]·p_j^c
        self.normalizer = np.zeros((c, n), np.float32)  # Σ_j e_ij·[j holds c]
        self.done = 0  # rows whose pairs with all earlier rows are summed

    def add(self, client: str, body: PrototypeUpload) -> None:
        """Upload ``body`` of ``client`` (already validated); its pairs are summed once a
        block of uploads waits, as one product against every earlier one."""
        if client in self.rows:
            return
        row = len(self.rows)
        if row == self.held.shape[0]:
            self._grow()
        classes = np.asarray(body["classes"], np.int64)
        self.per_class[:, row][classes] = body["prototypes"]
        self.held[row, classes] = True
        self.rows[client] = row
        self.bodies.append(body)
        if row + 1 - self.done >= max(BLOCK, self.done // 8):
            self._sum_pairs()

    def _sum_pairs(self) -> None:
        """Pairs of the waiting rows J with every row up to them: cos (Eq. 5), e_ij for
        the earlier rows' sums and e_ji for J's, each shifted by its row's own cosine as
        the batched softmax is (a row's largest; 1 where held)."""
        first, n = self.done, len(self.rows)
        if first == n:
            return
        self._canonical_order(first, n)
        block = self.per_class[:, first:n]  # (C, B, d)
        norms = np.linalg.norm(block, axis=2, keepdims=True)
        self.unit[:, first:n] = block / np.maximum(norms, 1e-12)
        self.own[:, first:n] = np.einsum(
            "cbd,cbd->cb", self.unit[:, first:n], self.unit[:, first:n]
        )
        unit = self.unit[:, :n]
        cosine = np.matmul(unit[:, first:n], unit.transpose(0, 2, 1))  # (C, B, n)
        held = self.held[:n].T.astype(np.float32)  # (C, n)
        terms = self.per_class[:, :n]  # [j holds c]·p_j^c: zero where not held
        # into the earlier rows: e_ij for i < first, j in the block
        into_earlier = np.exp(
            (cosine[:, :, :first].transpose(0, 2, 1) - self.own[:, :first, None]) / self.tau
        )  # (C, first, B)
        self.numerator[:, :first] += np.matmul(into_earlier, terms[:, first:n])
        self.normalizer[:, :first] += np.matmul(into_earlier, held[:, first:n, None])[..., 0]
        # the block's own rows: e_ji over every j up to n (themselves included)
        into_block = np.exp((cosine - self.own[:, first:n, None]) / self.tau)  # (C, B, n)
        self.numerator[:, first:n] = np.matmul(into_block, terms)
        self.normalizer[:, first:n] = np.matmul(into_block, held[..., None])[..., 0]
        self.done = n

    def _canonical_order(self, first: int, n: int) -> None:
        """Rows ``first..n`` in client order rather than arrival order: a sum's float32
        rounding depends on its order, and the same seed must give the same Q_i however
        the uploads raced (every run whose round is one block: up to ``BLOCK`` uploads)."""
        arrived = sorted(self.rows, key=self.rows.__getitem__)[first:n]
        ordered = sorted(arrived)
        if ordered == arrived:
            return
        moved = np.array([self.rows[c] for c in ordered])
        self.per_class[:, first:n] = self.per_class[:, moved]
        self.held[first:n] = self.held[moved]
        bodies = [self.bodies[row] for row in moved]
        for row, client in enumerate(ordered, start=first):
            self.rows[client] = row
            self.bodies[row] = bodies[row - first]

    def covers(self, t: int, clients: Sequence[str], bodies: Sequence[Body]) -> bool:
        """Whether round ``t`` aggregates exactly these arrivals (the same upload objects)."""
        return (
            t == self.t
            and len(clients) == len(self.rows)
            and all(
                self.rows.get(c) is not None and self.bodies[self.rows[c]] is b
                for c, b in zip(clients, bodies, strict=True)
            )
        )

    def personalized(self, clients: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Q (N, C, d) by Eq. 7 where held, prototypes (N, C, d), mask (N, C)) in the order
        of ``clients``; rows of classes a client lacks are left to Eq. 8."""
        self._sum_pairs()
        order = np.fromiter((self.rows[c] for c in clients), np.int64, len(clients))
        q = self.numerator[:, order]
        q /= np.maximum(self.normalizer[:, order], np.finfo(np.float32).tiny)[..., None]
        q = q.transpose(1, 0, 2)
        return q, self.per_class[:, order].transpose(1, 0, 2), self.held[order]

    def _grow(self) -> None:
        self.per_class = np.concatenate([self.per_class, np.zeros_like(self.per_class)], axis=1)
        self.held = np.concatenate([self.held, np.zeros_like(self.held)])
        self.unit = np.concatenate([self.unit, np.zeros_like(self.unit)], axis=1)
        self.own = np.concatenate([self.own, np.zeros_like(self.own)], axis=1)
        self.numerator = np.concatenate([self.numerator, np.zeros_like(self.numerator)], axis=1)
        self.normalizer = np.concatenate([self.normalizer, np.zeros_like(self.normalizer)], 1)
