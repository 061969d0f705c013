"""The result table that ends a run: per client, the mean, and the Local reference."""

from __future__ import annotations

from typing import Any


def format_table(summary: dict[str, Any]) -> str:
    """The per-client result table printed at the end of a run; with the summary's
    ``local_reference`` (:mod:`mqttfl.evaluation.reference`), each client's accuracy trained alone
    (``local``) and the difference (``gain``) stand beside its accuracy."""
    reference = summary.get("local_reference")
    lines = [
        f"{summary['method']} on run {summary['run_id']}: {summary['rounds_completed']} rounds "
        "(means over the last 5 rounds)",
        f"{'client':>8} {'accuracy':>9}"
        + (f" {'local':>9} {'gain':>9}" if reference else "")
        + f" {'macro-F1':>9} {'MAE':>7} {'KB sent':>10} {'KB recv':>10}",
    ]
    for client, row in summary["clients"].items():
        lines.append(
            f"{client:>8} {row['accuracy']:>9.4f}{_reference_cells(reference, client)} "
            f"{row['f1']:>9.4f} {row['mae']:>7.3f} "
            f"{row['kb_sent']:>10.1f} {row['kb_received']:>10.1f}"
        )
    mean = summary["mean"]
    comm = summary["comm"]
    lines.append(
        f"{'mean':>8} {mean['accuracy']:>9.4f}{_reference_cells(reference, None)} "
        f"{mean['f1']:>9.4f} {mean['mae']:>7.3f}"
    )
    if reference:
        lines.append(_reference_note(reference))
    lines.append(
        f"payload per client-round: up {comm['up_bytes_per_client_round'] / 1000:.2f} KB, "
        f"down {comm['down_bytes_per_client_round'] / 1000:.2f} KB"
    )
    if summary.get("rejections"):
        lines.append(f"rejected uploads: {summary['rejections']}")
    return "\n".join(lines)


def _reference_cells(reference: dict[str, Any] | None, client: str | None) -> str:
    """`` local gain`` cells of a client's row (``None``: the mean row), or nothing."""
    if not reference:
        return ""
    gains = reference["gain"]["clients"]
    if client is None:
        compared = [reference["clients"][c]["accuracy"] for c in gains]
        local, gain = (
            (sum(compared) / len(compared) if compared else None),
            reference["gain"]["mean"],
        )
    else:
        local = reference["clients"].get(client, {}).get("accuracy")
        gain = gains.get(client)
    if local is None or gain is None:
        return f" {'-':>9} {'-':>9}"
    return f" {local:>9.4f} {gain:>+9.4f}"


def _reference_note(reference: dict[str, Any]) -> str:
    if reference["source"] == "cached":
        how = f"reused from {reference['cache']}"
    else:
        how = f"trained in {reference['seconds']:.0f} s, " + (
            f"cached in {reference['cache']}" if reference["cache"] else "could not be cached"
        )
    return (
        "local: each client trained alone (method local: same shards, model, seed, [train] "
        f"and rounds); gain = accuracy - local\nlocal reference: {how}"
    )
