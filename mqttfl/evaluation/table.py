"""The result table that ends a run: per client, the mean, and the Local reference.

Every table names the split that produced it (``summary.split``: window or session,
:mod:`mqttfl.data.sessions`) and shows an MAE only where labels are counts
(``summary.ordinal_labels``). With a Local reference, one line says what federation
bought: the mean gain over training alone.
"""

from __future__ import annotations

from itertools import zip_longest

from mqttfl.engine.documents import LocalReferenceBlock, PrivacyBlock, RunSummary
from mqttfl.monitor.buffered import buffered_note

SPLIT_TEXT = {
    "window": "window split (test windows from sessions the client trained on)",
    "session": "session split (test sessions the client never trained on)",
}


def run_split(summary: RunSummary) -> str:
    """The split a summary's numbers come from (older summaries: their config's, else window)."""
    return summary.data_split


def shows_mae(summary: RunSummary) -> bool:
    """An MAE means something only for counts; summaries from before ``ordinal_labels``
    keep theirs."""
    return summary.shows_mae


def format_table(summary: RunSummary) -> str:
    """The per-client result table printed at the end of a run; with the summary's
    ``local_reference`` (:mod:`mqttfl.evaluation.reference`), each client's accuracy trained alone
    (``local``) and the difference (``gain``) stand beside its accuracy."""
    reference = summary.local_reference
    mae = summary.shows_mae
    split = summary.data_split
    spent = None if summary.privacy is None else summary.privacy.epsilon  # ε per client
    lines = [
        f"{summary.method} on run {summary.run_id}: {summary.rounds_completed} rounds, "
        f"{SPLIT_TEXT.get(split, f'{split} split')}; means over the last 5 rounds",
        f"{'client':>8} {'accuracy':>9}"
        + (f" {'local':>9} {'gain':>9}" if reference else "")
        + f" {'macro-F1':>9}"
        + (f" {'MAE':>7}" if mae else "")
        + f" {'KB sent':>10} {'KB recv':>10}"
        + (f" {'ε':>7}" if spent is not None else ""),
    ]
    for client, row in summary.clients.items():
        lines.append(
            f"{client:>8} {row.accuracy:>9.4f}{_reference_cells(reference, client)} "
            f"{row.f1:>9.4f}"
            + (f" {row.mae:>7.3f}" if mae else "")
            + f" {row.kb_sent:>10.1f} {row.kb_received:>10.1f}"
            + (f" {spent.get(client, 0.0):>7.2f}" if spent is not None else "")
        )
    mean = summary.mean
    comm = summary.comm
    lines.append(
        f"{'mean':>8} {mean.accuracy:>9.4f}{_reference_cells(reference, None)} "
        f"{mean.f1:>9.4f}" + (f" {mean.mae:>7.3f}" if mae else "")
    )
    if reference:
        lines.append(_reference_note(reference))
    lines.append(
        f"payload per client-round: up {comm.up_bytes_per_client_round / 1000:.2f} KB, "
        f"down {comm.down_bytes_per_client_round / 1000:.2f} KB"
    )
    lines += dropout_notes(summary)
    if summary.ended_early:
        lines.append(f"the run ended early: {summary.ended_early}")
    if summary.rejections:
        lines.append(f"rejected uploads: {summary.rejections}")
    if summary.buffered is not None:  # federation.mode = "buffered"
        lines.append(buffered_note(summary.buffered))
    if summary.privacy is not None:
        lines.append(privacy_note(summary.privacy))
    if reference:
        verdict = federation_verdict(summary)
        if verdict:
            lines.append(verdict)
    return "\n".join(lines)


def dropout_notes(summary: RunSummary) -> list[str]:
    """One line per client that missed rounds, left or reported its last metrics before
    the run's last round: which rounds its figures cover, and when it went and came back."""
    notes = []
    last = summary.rounds_completed
    for client, row in summary.clients.items():
        said = []
        if row.selected:
            said.append(
                f"uploaded in {row.uploaded} of the {row.selected} rounds it was selected for"
            )
        for gone, back in zip_longest(row.left or [], row.rejoined or []):
            said.append(f"left in round {gone}" + (f", back in round {back}" if back else ""))
        covered = row.last_rounds or []
        ends_early = bool(covered) and covered[-1] < last
        if not (row.missed or row.left or ends_early):
            continue
        if covered:
            span = f"{covered[0]}-{covered[-1]}" if len(covered) > 1 else f"{covered[0]}"
            said.append(f"its figures are of rounds {span}")
        notes.append(f"client {client}: " + "; ".join(said))
    return notes


def federation_verdict(summary: RunSummary) -> str | None:
    """One line: what federation bought over training alone, on this split."""
    reference = summary.local_reference
    if reference is None:
        return None
    gains, mean_gain = reference.gain.clients, reference.gain.mean
    compared = [c for c in gains if c in reference.clients and c in summary.clients]
    if not compared or mean_gain is None:
        return None
    local = [reference.clients[c].accuracy for c in compared]
    federated = [summary.clients[c].accuracy for c in compared]
    won = sum(1 for c in compared if gains[c] > 0)
    fed_mean, local_mean = sum(federated) / len(federated), sum(local) / len(local)
    word = "gained" if mean_gain > 0 else "lost" if mean_gain < 0 else "changed"
    return (
        f"federation {word} {abs(mean_gain) * 100:.1f} points over training alone "
        f"({summary.method} {fed_mean * 100:.1f} % vs Local {local_mean * 100:.1f} %, "
        f"{summary.data_split} split); {won} of {len(compared)} clients gained"
    )


def _reference_cells(reference: LocalReferenceBlock | None, client: str | None) -> str:
    """`` local gain`` cells of a client's row (``None``: the mean row), or nothing."""
    if not reference:
        return ""
    gains = reference.gain.clients
    local: float | None
    if client is None:
        compared = [reference.clients[c].accuracy for c in gains if c in reference.clients]
        local = sum(compared) / len(compared) if compared else None
        gain = reference.gain.mean
    else:
        row = reference.clients.get(client)
        local = None if row is None else row.accuracy
        gain = gains.get(client)
    if local is None or gain is None:
        return f" {'-':>9} {'-':>9}"
    return f" {local:>9.4f} {gain:>+9.4f}"


def _reference_note(reference: LocalReferenceBlock) -> str:
    if reference.source == "cached":
        how = f"reused from {reference.cache}"
    else:
        how = f"trained in {reference.seconds:.0f} s, " + (
            f"cached in {reference.cache}" if reference.cache else "could not be cached"
        )
    return (
        "local: each client trained alone (method local: same shards, model, seed, [train] "
        f"and rounds); gain = accuracy - local\nlocal reference: {how}"
    )


def privacy_note(privacy: PrivacyBlock) -> str:
    """One line under the table of a private run: what ε is and what it was spent on."""
    budget = privacy.budget
    return (
        f"ε: each client's differential privacy over the uploads it made, at δ="
        f"{privacy.delta:g} (clip {privacy.clip:g}, noise multiplier "
        f"{privacy.noise_multiplier:.3f}"
        + (f", budget ε={budget:g}" if budget is not None else "")
        + "; mqttfl/privacy)"
    )
