"""The run's report: report.json (everything the checker found, the faults, the throughput
per second), report.md (the same for people) and timeline.svg (acknowledged writes per second,
with the faults as bands and the anomalies as red ticks)."""

import json
from pathlib import Path

COLORS = {
    "kill": "#f4a3a3", "kill-leader": "#e06666", "pause": "#a4c2f4", "restart": "#f9cb9c",
    "partition": "#b6d7a8", "partition-oneway": "#d9ead3", "partition-bridge": "#93c47d",
    "leader-move": "#b4a7d6",
}  # fmt: skip


def acks_per_second(history, seconds):
    counts = [0] * (int(seconds) + 1)
    for s in history.sends:
        if s[7] is not None and s[6] is not None and int(s[6]) < len(counts):
            counts[int(s[6])] += 1
    return counts


def timeline_svg(throughput, faults, anomalies, seconds):
    width, height, pad = 900, 260, 40
    top = max(throughput) if throughput and max(throughput) > 0 else 1

    def x(t):
        return pad + (width - 2 * pad) * t / max(seconds, 1)

    def y(v):
        return height - pad - (height - 2 * pad) * v / top

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>']  # fmt: skip
    for f in faults:
        x0, x1 = x(f["t0"]), x(f["t1"] if f["t1"] is not None else seconds)
        parts.append(f'<rect x="{x0:.1f}" y="{pad}" width="{max(x1 - x0, 1.5):.1f}" height="{height - 2 * pad}" '
                     f'fill="{COLORS.get(f["kind"], "#ddd")}"><title>{f["kind"]} {f["nodes"]}</title></rect>')  # fmt: skip
    points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in enumerate(throughput))
    parts.append(f'<polyline points="{points}" fill="none" stroke="#222" stroke-width="1"/>')
    for kind, examples in anomalies.examples.items():
        for e in examples:
            parts.append(f'<line x1="{x(e["t"]):.1f}" x2="{x(e["t"]):.1f}" y1="{pad - 8}" y2="{pad}" stroke="red" '
                         f'stroke-width="2"><title>{kind}: {e["what"]}</title></line>')  # fmt: skip
    parts += [
        f'<line x1="{pad}" x2="{width - pad}" y1="{height - pad}" y2="{height - pad}" stroke="#888"/>',
        f'<text x="{pad}" y="{height - 12}">0 s</text><text x="{width - pad - 30}" y="{height - 12}">{seconds:.0f} s</text>',
        f'<text x="{pad}" y="{pad - 14}">acknowledged writes per second (max {top}); bands: faults; red: anomalies</text>',
    ]  # fmt: skip
    x_legend = pad
    for kind, color in COLORS.items():
        parts.append(f'<rect x="{x_legend}" y="{height - 30}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{x_legend + 13}" y="{height - 21}">{kind}</text>')  # fmt: skip
        x_legend += 13 + 7 * len(kind) + 12
    parts.append("</svg>")
    return "\n".join(parts)


def fault_nodes(f):
    if f["kind"] == "partition-bridge":
        return f"bridge {f['nodes'][0]} between {f['sides'][0]} and {f['sides'][1]}"
    if f["kind"] == "kill-leader":
        led = f.get("leader_of")
        return f"{f['nodes']}, " + (f"leader of partition {led}" if led is not None else "leader unknown: a random node")
    if f["kind"] == "leader-move":
        moved = f.get("moved") or {}
        if not moved:
            return "every partition led by its preferred replica: nothing to move"
        said = ", ".join(f"{p}: {'moved' if why is None else why}" for p, why in sorted(moved.items()))
        return f"to preferred replicas {f['nodes']} ({said})"
    return str(f["nodes"])


def write(out, run, history, faults, anomalies, notes):
    """`run`: the run's settings and counts; `notes`: counts that are not anomalies."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seconds = run["seconds"]
    throughput = acks_per_second(history, seconds)
    doc = {
        **run,
        "anomalies": {"total": anomalies.total(), "counts": anomalies.counts, "examples": anomalies.examples},
        "notes": notes,
        "faults": faults,
        "acks_per_second": throughput,
        "client_errors": len(history.client_errors),
    }
    (out / "report.json").write_text(json.dumps(doc, indent=1))
    (out / "timeline.svg").write_text(timeline_svg(throughput, faults, anomalies, seconds))

    by_kind = {}
    for f in faults:
        by_kind[f["kind"]] = by_kind.get(f["kind"], 0) + 1
    lines = [
        f"# ferrolog-check: {run['target']}, {seconds:.0f} s, seed {run['seed']}",
        "",
        f"**{anomalies.total()} anomalies.** {run['nodes']} nodes, {run['partitions']} partitions (RF {run['nodes']}), "
        f"{run['producers']} producers ({run['idempotent']} idempotent), consumers: assign and subscribe.",
        "",
        "| | count |", "|---|---|",
        f"| sends | {run['sends']} |", f"| acknowledged | {run['acked']} |",
        f"| not acknowledged (indeterminate: failed, timed out or never sent) | {notes['indeterminate']} |",
        f"| of those, found in the log | {notes['indeterminate-found-in-log']} |",
        f"| left unflushed at the end | {run['unflushed']} |",
        f"| polls | {run['polls']} |", f"| final log records | {run['final_records']} |",
        f"| commits acknowledged / read back / assignments resumed | {run['commits']} / {run['committed_reads']} / {run['resumes']} |",
        f"| duplicates from producers without idempotence (allowed) | {notes['duplicates-without-idempotence']} |",
        f"| duplicates resent by a client under a bumped epoch (allowed; librdkafka#4953) | {notes['duplicates-after-epoch-bump']} |",
        f"| brokers that stopped by themselves on a broken disk (allowed) | {len(run['disk_exits'])} |",
        f"| client errors reported | {len(history.client_errors)} |",
        *([f"| transactions committed / aborted / outcome unknown (of those, found read_committed) | "
           f"{notes['transactions-committed']} / {notes['transactions-aborted']} / {notes['transactions-unknown']} "
           f"({notes['transactions-unknown-found']}) |"] if "transactions-committed" in notes else []),
        "",
        f"Consumers caught up with the final high watermarks: **{'yes' if run['consumers_caught_up'] else 'no: unseen was not checked'}**.",
        *([f"**The run itself failed:** {'; '.join(run['run_failures'])}."] if run["run_failures"] else []),
        "",
        "## Anomalies", "", "| kind | count |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in anomalies.counts.items()],
        "",
    ]  # fmt: skip
    for kind, examples in anomalies.examples.items():
        if examples:
            lines += [f"### {kind}", "", *[f"- {e['t']:.1f} s: {e['what']}" for e in examples], ""]
    if notes["epoch-bump-examples"]:
        lines += ["### duplicates resent under a bumped epoch (not anomalies)", "",
                  *[f"- {what}" for what in notes["epoch-bump-examples"]], ""]  # fmt: skip
    lines += [
        "## Faults", "",
        ", ".join(f"{k} ×{v}" for k, v in sorted(by_kind.items())) or "none", "",
        "![timeline](timeline.svg)", "",
        "| start (s) | end (s) | fault | nodes |", "|---|---|---|---|",
        *[f"| {f['t0']:.1f} | {(f['t1'] or seconds):.1f} | {f['kind']} | {fault_nodes(f)} |" for f in faults],
        "",
    ]  # fmt: skip
    (out / "report.md").write_text("\n".join(lines))
