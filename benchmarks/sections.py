"""The section of the benchmark pages each benchmark's result prints as (``python -m
benchmarks.summarize``): one function per section, from the result document to markdown
lines. :mod:`benchmarks.registry` names each benchmark's section.
"""

from __future__ import annotations

from typing import Any


def _ms(value: dict[str, Any] | None, key: str = "median") -> str:
    return f"{value[key] * 1000:.1f}" if value and value.get("n") else "n/a"


def _median(value: dict[str, Any] | None) -> float:
    return float(value["median"]) if value and value.get("n") else float("nan")


def _head(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    return f"_{doc['date']}, `{doc['command']}`, load average at the end {m['load_average']}_\n"


def fanin(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Fan-in",
        "",
        _head(doc),
        "| N | coordinator: received + validated (ms) | raw aiomqtt subscriber (ms) | publisher all acked (ms) |",
        "|---|---|---|---|",
    ]
    for r in doc["sizes"]:
        lines.append(
            f"| {r['n']} | {_ms(r['coordinator_fanin_s'])} | {_ms(r['raw_aiomqtt_fanin_s'])} | "
            f"{_ms(r['publisher_all_acked_s'])} |"
        )
    return lines


def coordinator(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Coordinator overhead per round",
        "",
        _head(doc),
        "| N | BLAS threads | last upload -> downlinks published (ms) | -> next start (ms) | aggregate | "
        "checkpoint | publish downlinks |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, key in (("default", "sizes"), ("1", "single_blas_thread_sizes")):
        for r in doc.get(key, []):
            lines.append(
                f"| {r['n']} | {label} | {_ms(r['overhead_downlinks_s'])} | "
                f"{_ms(r['overhead_next_start_s'])} | "
                f"{_ms(r['aggregate_s'])} | {_ms(r.get('checkpoint_s'))} | {_ms(r['publish_downlinks_s'])} |"
            )
    return lines


def aggregation(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### FedAPA aggregation (C=21, d=256, personalized Q for every client)",
        "",
        _head(doc),
        "| N | BLAS threads | server.aggregate median (ms) | min (ms) | CPU (ms) | core median (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for label, key in (("default", "sizes"), ("1", "single_thread_sizes")):
        for r in doc.get(key, []):
            lines.append(
                f"| {r['n']} | {label} | {_ms(r['server_aggregate_s'])} | "
                f"{_ms(r['server_aggregate_s'], 'min')} | "
                f"{_ms(r['server_aggregate_cpu_s'])} | {_ms(r['core_s'])} |"
            )
    return lines


def codec(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Codec",
        "",
        _head(doc),
        "| payload | bytes | encode (ms/MB) | decode (ms/MB) | schema check (ms/MB) |",
        "|---|---|---|---|---|",
    ]
    for r in doc["payloads"]:
        check = f"{r['validate_ms_per_mb']['median']:.3f}" if "validate_ms_per_mb" in r else "-"
        lines.append(
            f"| {r['payload']} | {r['bytes']:,} | {r['encode_ms_per_mb']['median']:.3f} | "
            f"{r['decode_ms_per_mb']['median']:.3f} | {check} |"
        )
    return lines


def round_(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Whole round",
        "",
        _head(doc),
        "| method | cycle (s) | slowest training (s) | ratio | ratio vs evaluation + training | "
        "coordinator turnaround (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["methods"]:
        lines.append(
            f"| {r['method']} | {r['cycle_s']['median']:.3f} | {r['slowest_training_s']['median']:.3f} | "
            f"{r['ratio']['median']:.3f} | {_median(r.get('ratio_vs_eval_plus_training')):.3f} | "
            f"{_ms(r['coordinator_turnaround_s'])} |"
        )
    return lines


def bytes_(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Bytes per client-round",
        "",
        _head(doc),
        "| method | model | up (KB) | down (KB) | Table V theory (KB) | measured / theory | framing up | "
        "framing down | with MQTT header, worst |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["methods"]:
        if "error" in r:
            lines.append(f"| {r['method']} | failed: {r['error'][:80]} |")
            continue
        wire = r["wire"]

        def pct(direction: str, key: str = "framing_overhead", wire: dict[str, Any] = wire) -> str:
            value = wire.get(direction, {}).get(key)
            return f"{value * 100:.2f}%" if value is not None else "-"

        worst = [
            v.get("framing_overhead_with_mqtt")
            for v in wire.values()
            if v.get("framing_overhead_with_mqtt") is not None
        ]
        theory = r.get("theoretical")
        theory_cell = f"{theory['bytes'] / 1000:.2f} ({theory['formula']})" if theory else "-"
        ratio_cell = f"{r['measured_over_theoretical']:.3f}" if theory else "-"
        worst_cell = f"{max(worst) * 100:.2f}%" if worst else "-"
        lines.append(
            f"| {r['method']} | {r['model']} | {r['up_bytes_per_client_round'] / 1000:.2f} | "
            f"{r['down_bytes_per_client_round'] / 1000:.2f} | {theory_cell} | {ratio_cell} | "
            f"{pct('up')} | {pct('down')} | {worst_cell} |"
        )
    return lines


def flower(doc: dict[str, Any]) -> list[str]:
    if "skipped" in doc:
        return ["### Flower, side by side", "", doc["skipped"]]
    lines = [
        "### Flower, side by side (FedAvg)",
        "",
        _head(doc),
        "| | wall (s), per run | round (s), median per run | client bytes per client-round | "
        "accuracy (last 5) |",
        "|---|---|---|---|---|",
    ]
    for name in ("mqttfl", "flower"):
        runs = doc[name]
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in runs)
        rounds = ", ".join(f"{r['round_s']['median']:.2f}" for r in runs)
        lines.append(
            f"| {name} | {walls} | {rounds} | {runs[0]['client_bytes_per_client_round'] / 1000:.0f} KB | "
            f"{runs[0]['mean_accuracy_last5']:.4f} |"
        )
    lines += [
        "",
        f"Ratios mqttfl / Flower (medians): wall time **{doc['wall_time_ratio']:.3f}**, round time "
        f"**{doc['round_time_ratio']:.3f}**, bytes **{doc['bytes_ratio']:.3f}**.",
    ]
    return lines


def accuracy(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Accuracy",
        "",
        _head(doc),
        f"size {doc['size']}, seeds {doc['seeds']}, {doc['seconds'] / 60:.1f} min",
        "",
    ]
    for name, data in doc["datasets"].items():
        if "skipped" in data:
            lines += [f"#### {name}: skipped ({data['skipped']})", ""]
            continue
        lines += [
            f"#### {name} ({data['config']}, seeds {data.get('seeds', doc['seeds'])}, "
            f"{' '.join(data['overrides'])})",
            "",
            "Table III",
            "",
            data["tables"]["table_iii"],
            "Table IV",
            "",
            data["tables"]["table_iv"],
            *_fedali_curve(data),
        ]
    return lines


def _fedali_curve(data: dict[str, Any]) -> list[str]:
    """FedAli's learning curve beside FedAvg's on the same transformer (data setting)."""
    curves: dict[str, dict[int, list[float]]] = {}
    for run in data["runs"]:
        if run["setting"] == "data" and run["method"] in ("fedali", "fedavg@transformer"):
            for t, acc in run["curve"].items():
                curves.setdefault(run["method"], {}).setdefault(int(t), []).append(acc)
    if len(curves) < 2:
        return []
    rounds = sorted(set(curves["fedali"]) & set(curves["fedavg@transformer"]))
    shown = [t for t in rounds if t in (1, 2, 3, 5) or t % 5 == 0]
    lines = [
        "FedAli's learning curve beside FedAvg's on the same transformer and local recipe "
        "(mean client accuracy in %, mean over seeds)",
        "",
        "| method | " + " | ".join(f"round {t}" for t in shown) + " |",
        "|---|" + "---|" * len(shown),
    ]
    for method, by_round in curves.items():
        cells = " | ".join(f"{sum(by_round[t]) / len(by_round[t]) * 100:.1f}" for t in shown)
        lines.append(f"| {method} | {cells} |")
    return [*lines, ""]


def scale(doc: dict[str, Any]) -> list[str]:
    b = doc["bytes"]
    lines = [
        "### Many clients: bytes per client-round against N (up + down, C=21, d=256)",
        "",
        _head(doc),
        "| method | " + " | ".join(f"N={n}" for n in b["sizes"]) + " |",
        "|---|" + "---|" * len(b["sizes"]),
    ]
    for label, rows in b["table"].items():
        cells = " | ".join(f"{r['bytes_per_client_round_max'] / 1000:,.1f} KB" for r in rows)
        lines.append(f"| {label} | {cells} |")
    lines += [
        "",
        "![bytes per client-round against N](docs/figures/bytes_vs_n.png)",
        "",
        "### Many clients: FedAPA (bounded) rounds against load clients",
        "",
        "| N | rounds | uploads accepted | clients holding their complete downlink | "
        "down KB per client | last upload -> downlinks acked (ms) | aggregate (ms) | "
        "last upload -> every client holds its downlink (ms, median / worst) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in doc["rounds"]["by_n"].items():
        held = r["last_upload_to_all_downlinks_held_s"]
        lines.append(
            f"| {n} | {r['rounds']} | {min(r['uploads_accepted'])} each | "
            f"{min(r['complete_downlinks'])} each | "
            f"{_median(r['down_bytes_per_client']) / 1000:.1f} | "
            f"{_ms(r['overhead_downlinks_s'])} | {_ms(r['aggregate_s'])} | "
            f"{_ms(held)} / {_ms(held, 'max')} |"
        )
    lines += ["", "| start-up (fresh process) | median (ms) | min | max |", "|---|---|---|---|"]
    for name, v in doc["startup"]["commands"].items():
        lines.append(f"| `{name}` | {_ms(v)} | {_ms(v, 'min')} | {_ms(v, 'max')} |")
    return lines


def fleet(doc: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if f := doc.get("federation"):
        rounds = ", ".join(f"{s:.1f}" for s in f["round_wall_s"])
        lines += [
            f"### Many clients: a {f['clients']}-client training federation in "
            f"{f['fleets']} fleets",
            "",
            _head(doc),
            f"`mqttfl run configs/fedapa-csi.toml --fleets {f['fleets']}` with "
            + " ".join(f"`{o}`" for o in f["overrides"])
            + f": {f['rounds']} rounds, {f['clients_reporting']} clients reporting, "
            f"join {f['join_s']:.1f} s, round to round {rounds} s, whole job {f['wall_s']:.1f} s.",
            "",
            "| process | count | peak RSS (MB), max | median |",
            "|---|---|---|---|",
        ]
        for role, v in f["peak_rss_mb"].items():
            lines.append(f"| {role} | {v['processes']} | {v['max']:.0f} | {v['median']:.0f} |")
        lines.append(f"| all together, at their peak | | {f['peak_total_gb'] * 1024:.0f} | |")
    if a := doc.get("accuracy"):
        lines += [
            "",
            f"### FedAPA exact against bounded P: {a['clients']} clients, {a['rounds']} rounds, "
            f"seeds {a['seeds']}",
            "",
            "| P | accuracy (%, mean ± sd over seeds) | per seed | down KB per client-round |",
            "|---|---|---|---|",
        ]
        for name, v in a["table"].items():
            per_seed = ", ".join(f"{r['accuracy'] * 100:.2f}" for r in v["runs"])
            lines.append(
                f"| {name} | {v['accuracy_mean'] * 100:.2f} ± {v['accuracy_sd'] * 100:.2f} | "
                f"{per_seed} | {v['down_kb_per_client_round']:.1f} |"
            )
    return lines


def crossroom(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Cross-room benefit: Local, Pooled and FedAvg-then-fine-tune per client",
        "",
        _head(doc),
        "| federation | clients, train windows each | Local | Pooled (gain) | "
        "FedAvg + fine-tune (gain) | clients gaining per seed (Pooled / FedAvg + FT) |",
        "|---|---|---|---|---|---|",
    ]

    def cell(v: dict[str, Any] | None) -> str:
        if v is None:
            return "absent"
        text = f"{v['mean'] * 100:.1f} ± {v['std'] * 100:.1f}"
        return text + (f" ({v['gain'] * 100:+.1f})" if "gain" in v else "")

    for name, f in doc["federations"].items():
        if "absent" in f:
            lines.append(f"| {name} | {f['absent']} | | | | |")
            continue
        sizes = f["train_samples_per_client"]
        span = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"
        gaining = " / ".join(
            ",".join(str(n) for n in f[k]["clients_gaining"]) if k in f else "-"
            for k in ("pooled", "fedavg_ft")
        )
        lines.append(
            f"| {name}: {f['note']} | {f['clients']}, {span} | "
            f"{cell(f['local'])} | {cell(f.get('pooled'))} | {cell(f.get('fedavg_ft'))} | {gaining} |"
        )
    return lines
