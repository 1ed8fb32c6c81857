"""Turns a harness run into results.json, report.md and SVG plots (bench/harness.py calls `write`).

Every number in the report comes from results.json; the plots are drawn by
`ferrolog-bench plot` from plots.json, written next to them.
"""

import json
import math
import statistics
import subprocess
from pathlib import Path

SCHEMA_VERSION = 1

# A run during which other processes used more of the machine than this is called out as noisy.
NOISY_OTHER_CPU_PCT = 20
# A run whose load generator used more than this share of its CPUs is called out: its
# latencies may include queueing in the client.
BUSY_CLIENT_CPU_PCT = 80

# (label, workload, step, metric, higher_is_better)
HEADLINE = [
    ("Max produce throughput, closed loop (MB/s)", "max-throughput", None, "throughput_mbps", True),
    ("Sustainable produce throughput, open-loop ramp (MB/s)", "max-throughput-sustainable", None, "sustainable_mbps", True),
    ("Produce p50 at 50% of Kafka's max (ms)", "fixed-rate", 0.5, "p50_ms", False),
    ("Produce p99 at 50% of Kafka's max (ms)", "fixed-rate", 0.5, "p99_ms", False),
    ("Produce p99.9 at 50% of Kafka's max (ms)", "fixed-rate", 0.5, "p999_ms", False),
    ("End-to-end p99 at 50% of Kafka's max (ms)", "fixed-rate", 0.5, "e2e_p99_ms", False),
    ("Fan-out (3 consumers) end-to-end p99, worst consumer (ms)", "fan-out", None, "e2e_p99_ms_worst_consumer", False),
    ("50 producers over 100 partitions: produce p99 at 50% of Kafka's max (ms)", "many-producers", None, "p99_ms", False),
    ("Keyed records (murmur2): produce p99 at 50% of Kafka's max (ms)", "keyed", None, "p99_ms", False),
    ("Drain of a 2 GiB backlog while producing at 50% of Kafka's max (MB/s read)", "drain-while-producing", None, "drain_mbps", True),
    ("Produce p99 during that drain, worst second (ms)", "drain-while-producing", None, "drain_worst_second_p99_ms", False),
    ("Catch-up read throughput (MB/s)", "catch-up", None, "throughput_mbps", True),
    ("Catch-up broker CPU (CPU-s per GiB read)", "catch-up", None, "broker_cpu_s_per_gib", False),
    ("  of which in the kernel (system calls) (CPU-s per GiB read)", "catch-up", None, "broker_kernel_cpu_s_per_gib", False),
    ("Catch-up, page cache dropped (MB/s)", "catch-up-cold", None, "throughput_mbps", True),
    ("Catch-up, page cache dropped: broker CPU (CPU-s per GiB read)", "catch-up-cold", None, "broker_cpu_s_per_gib", False),
    ("  of which in the kernel (system calls) (CPU-s per GiB read)", "catch-up-cold", None, "broker_kernel_cpu_s_per_gib", False),
    ("Transactions of 100 records, one producer: commits per second", "transactional", None, "transactions_per_s", True),
    ("Transactions of 100 records: commit p99 (ms)", "transactional", None, "commit_p99_ms", False),
    ("read_committed read of those transactions (MB/s)", "transactional", None, "read_committed_mbps", True),
    ("Produce broker CPU at max throughput (CPU-s per GiB)", "max-throughput", None, "broker_cpu_s_per_gib", False),
    ("  of which in the kernel (system calls) (CPU-s per GiB)", "max-throughput", None, "broker_kernel_cpu_s_per_gib", False),
    ("Same, with kernel threads (writeback, journal) (CPU-s per GiB)", "max-throughput", None, "broker_and_kernel_cpu_s_per_gib", False),
    ("Restart to first acked produce (ms)", "startup", None, "restart_to_ack_ms", False),
    ("Resident memory idle (MB)", "startup", None, "idle_rss_mb", False),
    ("Resident memory under max load, peak (MB)", "max-throughput", None, "broker_rss_peak_mb", False),
    ("Many partitions: idle CPU (% of a core)", "many-partitions", None, "idle_cpu_pct", False),
    ("Many partitions: produce p99 (ms)", "many-partitions", None, "p99_ms", False),
    ("3 nodes, RF=3: max produce throughput, closed loop (MB/s)", "replicated-throughput", None, "throughput_mbps", True),
    ("3 nodes, RF=3: produce p99 at a fixed rate (ms)", "replicated-fixed-rate", None, "p99_ms", False),
    ("3 nodes, RF=3, many partitions: idle CPU, all nodes (% of a core)", "replicated-many-partitions", None, "idle_cpu_pct", False),
    ("3 nodes, RF=3, many partitions: produce p99 (ms)", "replicated-many-partitions", None, "p99_ms", False),
]

WORKLOAD_NOTES = {
    "startup": "Time from exec of the broker (Kafka: of its start script, JVM start included) to the first acknowledged "
               "acks=all produce of one record; `first start` includes Kafka's storage format, `restart` is a second start "
               "on the same data. Idle figures are taken after the restart.",
    "max-throughput": "1 KiB records, acks=all, 16 partitions, 2 producer connections, batch 128 KiB, linger 5 ms, 5 requests "
                      "in flight per connection, closed loop (as fast as acknowledgements come back, 32 MiB producer buffer). "
                      "Latency in closed loop is mostly queueing in the producer and is given only for completeness.",
    "max-throughput-ramp": "Open-loop steps at fractions of each broker's own closed-loop max; latency from the intended send "
                           "time (coordinated omission corrected). A step 'broke down' when the broker fell behind the target "
                           "rate (acknowledged < 95% of target, or records left unacknowledged) or p99 exceeded "
                           "max(10 x the first step's p99, 50 ms). Sustainable = fastest step that did not break down.",
    "fixed-rate": "Open-loop producers at 25/50/75% of Kafka's (default mode) median closed-loop max, plus one consumer "
                  "tailing the topic. Produce latency is measured from the intended send time; end-to-end latency is the "
                  "consumer's receive time minus the intended send time written in each record.",
    "fan-out": "One open-loop producer stream read by 3 independent consumers: assign-based consumers "
               "(each reads every partition itself, no group coordinator), for both brokers alike.",
    "many-producers": "50 producer connections over a topic of 100 partitions (2 partitions each), open loop at 50% of "
                      "Kafka's max in all, 1 KiB records, acks=all, batch 128 KiB, linger 5 ms; produce latency only. "
                      "The shape of public critiques of thread-per-core brokers: many connections, small batches.",
    "keyed": "Records with keys (10,000 distinct, drawn at random), each sent to the partition the Java client's "
             "default partitioner picks (murmur2 of the key, modulo 16 partitions), open loop at 50% of Kafka's max, "
             "2 producer connections: every partition gets records all the time, so batches stay small. Produce latency only.",
    "drain-while-producing": "A 2 GiB backlog written first (closed loop, topic `drain`), then read from the start by one "
                             "consumer while 2 producer connections write on to the same topic, open loop at 50% of Kafka's "
                             "max for 15 s: drain = the backlog's bytes over the time the consumer took to reach the end "
                             "offsets it saw when it started. `drain_worst_second_p99_ms` is the highest per-second produce "
                             "p99 among the seconds the drain lasted (by intended send time); p50 … max are over the whole "
                             "15 s, drain and after.",
    "catch-up": "A backlog written first (closed loop), then read from the start by one consumer (Fetch: 50 MiB max, "
                "1 MiB per partition, one fetch in flight). The page cache is left as the writes left it: Kafka reads "
                "recent data from the page cache, ferrolog (Direct I/O) reads from the disk or its batch cache. "
                "MB/s counts record-batch bytes.",
    "catch-up-cold": "The catch-up backlog read again from the start after `sync` and `echo 3 > /proc/sys/vm/drop_caches`, "
                     "so both brokers read it from the disk.",
    "transactional": "One transactional producer (`ferrolog-bench txn-produce`, transaction protocol v1 on both brokers) "
                     "committing every 100 records of 1 KiB: per transaction AddPartitionsToTxn for the topic's 4 "
                     "partitions, one acks=all Produce of a transactional batch of 25 records to each, then EndTxn, each "
                     "waiting for the one before, as an application that commits every 100 records with the Java client. "
                     "CONCURRENT_TRANSACTIONS (the previous commit's markers not written yet) is retried after 20 ms, as the "
                     "Java client's first retry. Commit latency runs from AddPartitionsToTxn to EndTxn's answer. Then one "
                     "consumer reads everything from the start with isolation.level=read_committed.",
    "many-partitions": "One topic with many partitions on one node, created in steps of 5,000 (Kafka refuses larger "
                       "single operations). Idle CPU after the broker settles, then open-loop produce round-robin over "
                       "all partitions (1-record batches), then idle again. Before the measured run one record goes "
                       "to every partition (`first_write_all_s`), so that the run sees partitions that already have "
                       "files. A disk guard kills a broker that brings the data disk below 8 GiB free.",
    "replicated-throughput": "Three nodes of each broker on this machine (ferrolog `--cores 1` each, every node a Raft "
                             "voter; Kafka KRaft combined mode with a static voter set, 1 GiB heap each), one topic of "
                             "16 partitions with replication factor 3, acks=all, closed loop. The load generator opens "
                             "its 2 connections to every partition leader. ferrolog answers acks=all at Raft commit (a "
                             "majority fsynced), Kafka when the whole ISR has the batch (no fsync; kafka-flush fsyncs "
                             "each write on each node). CPU and memory are sums over the three nodes.",
    "replicated-fixed-rate": "Same cluster and topic, open loop at a fixed rate (coordinated omission corrected).",
    "replicated-many-partitions": "Same cluster, one topic with many RF=3 partitions: idle CPU of all three nodes once "
                                  "they settle (ferrolog: one Raft group per partition, quiescent when idle; Kafka: "
                                  "replica fetchers), then an open-loop produce round-robin over all partitions.",
}



def behind(m):
    """The run fell behind its offered rate (produce errors alone do not count)."""
    if not m.get("saturated"):
        return False
    if m.get("error_records"):
        t, r = m.get("throughput_rps"), m.get("rate_rps")
        return bool(t and r and t < 0.95 * r)
    return True


def fmt(v):
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        a = abs(v)
        if a >= 100:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def stat(values):
    vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)]
    if not vals:
        return None
    med = statistics.median(vals)
    lo, hi = min(vals), max(vals)
    return {"median": med, "min": lo, "max": hi, "n": len(vals), "values": vals,
            "spread_pct": round((hi - lo) / med * 100, 1) if med else None}


def summarize(runs):
    """summary[workload][step][metric][config] = stat over repetitions."""
    groups = {}
    for r in runs:
        key = (r["workload"], str(r["step"]) if r["step"] is not None else "-")
        for m, v in r["metrics"].items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            groups.setdefault(key, {}).setdefault(m, {}).setdefault(r["config"], []).append(v)
    out = {}
    for (w, step), metrics in groups.items():
        for m, by_config in metrics.items():
            for c, vals in by_config.items():
                s = stat(vals)
                if s:
                    out.setdefault(w, {}).setdefault(step, {}).setdefault(m, {})[c] = s
    return out


def get(summary, workload, step, metric, config):
    step = str(step) if step is not None else "-"
    return summary.get(workload, {}).get(step, {}).get(metric, {}).get(config)


def advantage(f, k, higher_better):
    """How many times better ferrolog is (>1 better, <1 worse)."""
    if f is None or k is None or f["median"] in (0, None) or k["median"] in (0, None):
        return None
    return round(f["median"] / k["median"] if higher_better else k["median"] / f["median"], 2)


def cell(s):
    if not s:
        return "n/a"
    if s["n"] == 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} [{fmt(s['min'])}–{fmt(s['max'])}]"


def adv_cell(a, row=None, k=None):
    if a is None and row and row.get(f"no_advantage_vs_{k}"):
        return f"n/a ({row[f'no_advantage_vs_{k}']})"
    if a is None and row and row.get("ferrolog") and row.get(k):
        f, o = row["ferrolog"]["median"], row[k]["median"]
        if f == 0 and o and not row["higher_is_better"]:
            return "**∞** (ferrolog 0)"
    if a is None:
        return "n/a"
    return f"**{a:.2f}×**" if a >= 1 else f"{a:.2f}×"


def pct(a, b):
    if a is None or not b:
        return None
    return round(a / b * 100, 1)


def hardware_percentages(summary, hw, configs):
    if not hw:
        return []
    rows = []
    lo = hw["loopback_tcp_mbps"]
    for c in configs:
        mt = get(summary, "max-throughput", None, "throughput_mbps", c)
        cu = get(summary, "catch-up", None, "throughput_mbps", c)
        cc = get(summary, "catch-up-cold", None, "throughput_mbps", c)
        fr = get(summary, "fixed-rate", 0.5, "p50_ms", c)
        fs = hw["fdatasync_direct_4k"]["p50_us"] / 1000 if c == "ferrolog" else hw["fdatasync_buffered_4k"]["p50_us"] / 1000
        rows.append({
            "config": c,
            "max_throughput_mbps": mt["median"] if mt else None,
            "max_throughput_pct_of_disk_write": pct(mt["median"] if mt else None, hw["direct_write_mbps"]),
            "max_throughput_pct_of_loopback": pct(mt["median"] if mt else None, lo),
            "catch_up_mbps": cu["median"] if cu else None,
            "catch_up_pct_of_disk_read": pct(cu["median"] if cu else None, hw["direct_read_mbps"]),
            "catch_up_pct_of_loopback": pct(cu["median"] if cu else None, lo),
            "catch_up_cold_mbps": cc["median"] if cc else None,
            "catch_up_cold_pct_of_disk_read": pct(cc["median"] if cc else None, hw["direct_read_mbps"]),
            "fixed_rate_50_p50_ms": fr["median"] if fr else None,
            "fdatasync_p50_ms": round(fs, 3),
            "fdatasync_p50_pct_of_produce_p50": pct(fs, fr["median"] if fr else None),
        })
    return rows


def median_run(runs, workload, config, step, metric):
    """The repetition whose `metric` is the median (for plots that show one run)."""
    rs = [r for r in runs if r["workload"] == workload and r["config"] == config and r["step"] == step
          and isinstance(r["metrics"].get(metric), (int, float)) and r.get("raw")]
    if not rs:
        return None
    rs.sort(key=lambda r: r["metrics"][metric])
    return rs[(len(rs) - 1) // 2]


def plots_spec(h, configs, summary):
    out_dir = h.out_dir
    plots = []

    def raw(r):
        return json.loads((out_dir / r["raw"]).read_text())

    for f in h.p["fixed_rate"]["fractions"]:
        series, e2e = [], []
        for c in configs:
            r = median_run(h.runs, "fixed-rate", c, f, "p99_ms")
            if r:
                d = raw(r)
                series.append({"name": c, "points": [[p, us / 1000] for p, us in d["produce"]["latency"]["curve"]]})
                if d["consumers"]:
                    e2e.append({"name": c, "points": [[p, us / 1000] for p, us in d["consumers"][0]["e2e_latency"]["curve"]]})
        pctl = int(f * 100)
        if series:
            plots.append({"file": f"produce-latency-fixed-rate-{pctl}.svg", "kind": "percentile", "y_log": True,
                          "title": f"Produce latency at {pctl}% of Kafka's max (acks=all, from intended send time)",
                          "x_label": "percentile", "y_label": "latency (ms)", "series": series})
        if e2e:
            plots.append({"file": f"e2e-latency-fixed-rate-{pctl}.svg", "kind": "percentile", "y_log": True,
                          "title": f"End-to-end latency at {pctl}% of Kafka's max", "x_label": "percentile",
                          "y_label": "latency (ms)", "series": e2e})
    for f in h.p["fixed_rate"]["fractions"]:
        series = []
        for c in configs:
            r = median_run(h.runs, "fixed-rate", c, f, "p99_ms")
            if r:
                lt = raw(r)["produce"].get("latency_timeline")
                if lt:
                    series.append({"name": c, "points": [[t, p99 / 1000] for t, _, p99, _ in lt]})
        if series:
            pctl = int(f * 100)
            plots.append({"file": f"p99-over-time-fixed-rate-{pctl}.svg", "kind": "line", "y_log": True,
                          "title": f"Produce p99 per second at {pctl}% of Kafka's max (by intended send time)",
                          "x_label": "seconds since start (warm-up included)", "y_label": "p99 latency (ms)", "series": series})
    series = []
    for c in configs:
        r = median_run(h.runs, "max-throughput", c, None, "throughput_mbps")
        if r:
            d = raw(r)
            # Whole seconds of the run only: the last one is the drain after the end.
            end = int(h.p["max_throughput"]["duration_s"])
            series.append({"name": c, "points": [[t, b / 1e6] for t, _, b in d["produce"]["timeline"] if t < end]})
    if series:
        plots.append({"file": "throughput-max.svg", "kind": "line", "title": "Acknowledged produce throughput over time, closed loop",
                      "x_label": "seconds since start", "y_label": "MB/s", "series": series})
    series = []
    for c in configs:
        pts = []
        for f in h.p["max_throughput"]["ramp"]:
            t = get(summary, "max-throughput-ramp", f, "throughput_mbps", c)
            l = get(summary, "max-throughput-ramp", f, "p99_ms", c)
            if t and l:
                pts.append([t["median"], l["median"]])
        if pts:
            series.append({"name": c, "points": sorted(pts)})
    if series:
        plots.append({"file": "latency-vs-throughput.svg", "kind": "line", "y_log": True,
                      "title": "Produce p99 vs achieved throughput (open-loop ramp, medians)",
                      "x_label": "achieved MB/s", "y_label": "p99 latency (ms)", "series": series})
    series = []
    for c in configs:
        r = median_run(h.runs, "catch-up", c, None, "throughput_mbps")
        if r:
            d = raw(r)
            pts = [[t, b / 1e6] for t, _, b in d["consume_timeline"]]
            while pts and pts[-1][1] == 0:
                pts.pop()
            series.append({"name": c, "points": pts[:-1] if len(pts) > 2 else pts})
    if series:
        plots.append({"file": "catch-up.svg", "kind": "line", "title": "Catch-up read throughput over time",
                      "x_label": "seconds since start", "y_label": "MB/s", "series": series})
    series = []
    for c in configs:
        r = median_run(h.runs, "fan-out", c, None, "e2e_p99_ms_worst_consumer")
        if r:
            d = raw(r)
            worst = max(d["consumers"], key=lambda x: x["e2e_latency"]["p99_us"])
            series.append({"name": c, "points": [[p, us / 1000] for p, us in worst["e2e_latency"]["curve"]]})
    if series:
        plots.append({"file": "e2e-latency-fan-out.svg", "kind": "percentile", "y_log": True,
                      "title": "Fan-out: end-to-end latency of the worst of 3 consumers", "x_label": "percentile",
                      "y_label": "latency (ms)", "series": series})
    return plots


def render_plots(h, plots):
    spec = h.out_dir / "plots.json"
    spec.write_text(json.dumps({"plots": plots}, indent=1) + "\n")
    r = subprocess.run([str(h.bench_bin), "plot", "--spec", str(spec), "--out-dir", str(h.out_dir / "plots")], capture_output=True, text=True)
    if r.returncode != 0:
        h.errors.append({"phase": 0, "config": "-", "rep": 0, "workload": "plots", "error": r.stderr[-1000:]})
        return []
    return [p["file"] for p in plots]


def write(h, interrupted):
    configs = list(h.args.configs)
    summary = summarize(h.runs)
    headline = []
    for label, w, step, metric, hib in HEADLINE:
        row = {"label": label, "workload": w, "step": step, "metric": metric, "higher_is_better": hib, "saturated": {}}
        for c in configs:
            row[c] = get(summary, w, step, metric, c)
            runs = [x for x in h.runs if x["workload"] == w and x["step"] == step and x["config"] == c]
            sat = sum(1 for x in runs if behind(x["metrics"]))
            if sat and metric.endswith("_ms"):
                row["saturated"][c] = f"{sat}/{len(runs)}"
        for k in ("kafka", "kafka-flush"):
            if "ferrolog" in configs and k in configs:
                # A latency of a broker that fell behind is the queue it built, which grows
                # with the run's length: no ratio is drawn from it.
                fell_behind = {"ferrolog", k} & set(row["saturated"])
                row[f"ferrolog_advantage_vs_{k}"] = None if fell_behind else advantage(row["ferrolog"], row[k], hib)
                if fell_behind:
                    row[f"no_advantage_vs_{k}"] = " and ".join(sorted(fell_behind)) + " behind"
        headline.append(row)
    hw_rows = hardware_percentages(summary, h.hw, configs)
    plots = plots_spec(h, configs, summary)
    plot_files = render_plots(h, plots)
    result = {
        "schema_version": SCHEMA_VERSION,
        "machine": h.machine,
        "quick": h.args.quick,
        "interrupted": interrupted,
        "elapsed_s": round(h.elapsed_s, 1) if getattr(h, "elapsed_s", None) else None,
        "profile": h.p,
        "configs": configs,
        "ferrolog_cores": h.args.ferrolog_cores,
        "pinned": getattr(h.args, "pinned", False),
        "kafka_reference_rps": getattr(h, "kafka_max_rps", None),
        "quiet_wait_s": round(getattr(h, "quiet_wait_s", 0.0), 1),
        "hardware": h.hw,
        "hardware_percentages": hw_rows,
        "settings": h.settings,
        "api_versions": h.api_versions,
        "headline": headline,
        "summary": summary,
        "runs": h.runs,
        "errors": h.errors,
        "flamegraphs": h.flames,
        "plots": [f"plots/{f}" for f in plot_files],
    }
    (h.out_dir / "results.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (h.out_dir / "report.md").write_text(markdown(h, result, summary))
    return h.out_dir / "report.md"


def markdown(h, r, summary):
    m = r["machine"]
    configs = r["configs"]
    L = []
    add = L.append
    add(f"# ferrolog vs Apache Kafka — {'quick smoke run' if r['quick'] else 'benchmark'} {m['date_utc'][:10]}")
    add("")
    add(f"Commit `{m['commit'][:12]}`{' (broker sources modified in the working tree)' if m['broker_sources_dirty'] else ''}, "
        f"ferrolog binary built {m['ferrolog_bin_mtime']} (sha256 {m['ferrolog_bin_sha256_16']}…), Apache Kafka {m['kafka_version']}.")
    add(f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, data on `{m['data_filesystem']}`. "
        f"Load average at start {' '.join(m['loadavg_at_start'])}.")
    reps = r["profile"]["reps"]
    fewer = [f"{name}: {n}" for key, name in (("many_partitions", "many-partitions"), ("replicated", "replicated"))
             if (n := min(reps, r["profile"].get(key, {}).get("reps", reps))) != reps]
    add(f"{reps} repetition(s) per workload{' (' + ', '.join(fewer) + ')' if fewer else ''}, brokers alternating in rotated order; cells are **median [min–max]**. "
        f"MB = 10^6 bytes. Total time {fmt(r['elapsed_s'])} s." if r["elapsed_s"] else "")
    if r["quick"]:
        add("")
        add("> Quick mode: tiny sizes, one repetition. It checks that the harness works; its numbers mean nothing.")
    if r["interrupted"]:
        add("")
        add(f"> Interrupted ({r['interrupted']}): only what was measured before is here.")
    others = [x["metrics"].get("other_cpu_pct") for x in r["runs"] if isinstance(x["metrics"].get("other_cpu_pct"), (int, float))]
    if others:
        add("")
        add(f"Background load (CPU used by other processes during measurements, % of all cores): median {fmt(statistics.median(others))}, "
            f"max {fmt(max(others))}" + (" (kernel threads, such as the writeback of Kafka's page cache, are counted apart, as "
            "`kernel_threads_cpu_s`). " if any("kernel_threads_cpu_s" in x["metrics"] for x in r["runs"]) else
            ". This run predates the split of kernel threads from other processes: the figure also holds kernel threads "
            "working for the brokers, such as the writeback of Kafka's page cache (hence Kafka's higher share). ") +
            f"{'**The machine was shared while this ran; treat the spread as noise.**' if max(others) > 10 else ''}")
        if r.get("quiet_wait_s"):
            add(f"Before each measurement the harness waited (at most 90 s) for other processes to use less than 15% of the "
                f"machine: {fmt(r['quiet_wait_s'])} s of waiting in all.")
    add("")
    add("## Headline")
    add("")
    hdr = "| metric | " + " | ".join(configs) + " |"
    adv_cols = [k for k in ("kafka", "kafka-flush") if "ferrolog" in configs and k in configs]
    hdr += "".join(f" ferrolog advantage vs {k} |" for k in adv_cols)
    add(hdr)
    add("|" + "---|" * (1 + len(configs) + len(adv_cols)))
    for row in r["headline"]:
        line = f"| {row['label']} | " + " | ".join(cell(row[c]) + (" †" if c in row.get("saturated", {}) else "") for c in configs) + " |"
        line += "".join(f" {adv_cell(row.get(f'ferrolog_advantage_vs_{k}'), row, k)} |" for k in adv_cols)
        add(line)
    add("")
    add("Advantage = how many times better ferrolog's median is (throughput: ferrolog/Kafka; latency, CPU, memory, time: "
        "Kafka/ferrolog). Above 1 (bold) ferrolog is better, below 1 it is worse.")
    sat_rows = {}
    for row in r["headline"]:
        for c, n in row.get("saturated", {}).items():
            where = row["workload"] + (f" at {int(row['step'] * 100)}% of Kafka's max" if row["step"] is not None else "")
            sat_rows[(where, c)] = n
    if sat_rows:
        add("")
        add("† The broker could not keep up with the offered rate (acknowledged < 95% of the target, or records left "
            "unacknowledged at the end): its latency there is the queue that built up, not a latency at that rate. "
            "Runs behind / runs: " + "; ".join(f"{c} in {w}: {n}" for (w, c), n in sat_rows.items()) + ".")
    add("")
    add("## Hardware limits (measured in this run)")
    add("")
    hw = r["hardware"]
    if hw:
        add("| probe | figure |")
        add("|---|---|")
        add(f"| Sequential Direct I/O write, {hw['options']['block_bytes'] >> 10} KiB blocks, {hw['options']['file_bytes'] >> 20} MiB + fdatasync | {fmt(hw['direct_write_mbps'])} MB/s |")
        add(f"| Sequential Direct I/O read, same file | {fmt(hw['direct_read_mbps'])} MB/s |")
        for k, name in (("fdatasync_direct_4k", "4 KiB Direct I/O append + fdatasync"), ("fdatasync_buffered_4k", "4 KiB buffered append + fdatasync")):
            s = hw[k]
            add(f"| {name} ({s['count']} times) | p50 {fmt(s['p50_us'] / 1000)} ms, p99 {fmt(s['p99_us'] / 1000)} ms, max {fmt(s['max_us'] / 1000)} ms |")
        add(f"| Loopback TCP, one stream | {fmt(hw['loopback_tcp_mbps'])} MB/s |")
        add("")
        add("Each broker's figures as a share of the limit that bounds them (a produce is bounded by both the disk write "
            "and loopback; a catch-up read by loopback, and by the disk when it misses the cache; an acks=all latency "
            "cannot go below one fdatasync — Direct I/O's for ferrolog, buffered for Kafka):")
        add("")
        add("| broker | max produce MB/s | % of disk write | % of loopback | catch-up MB/s | % of disk read | % of loopback | "
            "cold catch-up MB/s | % of disk read | produce p50 @50% (ms) | fdatasync p50 (ms) | fdatasync as % of p50 |")
        add("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for x in r["hardware_percentages"]:
            add(f"| {x['config']} | {fmt(x['max_throughput_mbps'])} | {fmt(x['max_throughput_pct_of_disk_write'])}% | {fmt(x['max_throughput_pct_of_loopback'])}% | "
                f"{fmt(x['catch_up_mbps'])} | {fmt(x['catch_up_pct_of_disk_read'])}% | {fmt(x['catch_up_pct_of_loopback'])}% | "
                f"{fmt(x.get('catch_up_cold_mbps'))} | {fmt(x.get('catch_up_cold_pct_of_disk_read'))}% | "
                f"{fmt(x['fixed_rate_50_p50_ms'])} | {fmt(x['fdatasync_p50_ms'])} | {fmt(x['fdatasync_p50_pct_of_produce_p50'])}% |")
        add("")
        shared = ("Pinned, the broker has one core of its own and the load generator the other" if r["pinned"]
                  else "On a 2-core machine the load generator shares the CPU with the broker")
        add(f"{shared}; loopback bandwidth is measured with "
            "nothing else running, so no broker can reach it while it also does its own work. A catch-up above 100% of "
            "the disk's read bandwidth was served from the page cache (Kafka writes through it; ferrolog writes with "
            "Direct I/O, so its first read of a backlog goes to the disk).")
    else:
        add("Hardware probe failed; see errors.")
    add("")
    add("## Workloads")
    for w, title in (("startup", "startup"), ("max-throughput", "max-throughput"), ("max-throughput-ramp", "max-throughput: open-loop ramp"),
                     ("fixed-rate", "fixed-rate"), ("fan-out", "fan-out"), ("many-producers", "many-producers"), ("keyed", "keyed"),
                     ("drain-while-producing", "drain-while-producing"), ("transactional", "transactional"),
                     ("catch-up", "catch-up"), ("catch-up-cold", "catch-up, page cache dropped"),
                     ("many-partitions", "many-partitions"),
                     ("replicated-throughput", "replicated: throughput"), ("replicated-fixed-rate", "replicated: fixed rate"),
                     ("replicated-many-partitions", "replicated: many partitions")):
        if w not in summary:
            continue
        add("")
        add(f"### {title}")
        add("")
        if w in WORKLOAD_NOTES:
            add(WORKLOAD_NOTES[w])
            add("")
        for step in sorted(summary[w], key=lambda s: (s == "-", float(s) if s != "-" else 0)):
            metrics = summary[w][step]
            if step != "-":
                frac = float(step)
                add(f"**{int(frac * 100)}%** " + ("of Kafka's max" if w == "fixed-rate" else "of the broker's own closed-loop max"))
                add("")
            add("| metric | " + " | ".join(configs) + " |")
            add("|" + "---|" * (1 + len(configs)))
            for metric in metrics:
                add(f"| {metric} | " + " | ".join(cell(metrics[metric].get(c)) for c in configs) + " |")
            add("")
        noisy = [x for x in r["runs"] if x["workload"] == w and (x["metrics"].get("other_cpu_pct") or 0) > NOISY_OTHER_CPU_PCT]
        if noisy:
            add(f"Runs during which other processes used more than {NOISY_OTHER_CPU_PCT}% of the machine: " + ", ".join(
                f"{x['config']} rep {x['rep'] + 1}{' step ' + str(x['step']) if x['step'] is not None else ''} "
                f"({fmt(x['metrics']['other_cpu_pct'])}%)" for x in noisy) + ".")
            add("")
        busy = [x for x in r["runs"] if x["workload"] == w and (x["metrics"].get("client_cpu_pct") or 0) > BUSY_CLIENT_CPU_PCT]
        if busy:
            add(f"Runs during which the load generator used more than {BUSY_CLIENT_CPU_PCT}% of the CPUs it runs on, so part "
                "of their latency may be queueing in the client: " + ", ".join(
                    f"{x['config']} rep {x['rep'] + 1}{' step ' + str(x['step']) if x['step'] is not None else ''} "
                    f"({fmt(x['metrics']['client_cpu_pct'])}%)" for x in busy) + ".")
            add("")
        flags = [x for x in r["runs"] if x["workload"] == w and (behind(x["metrics"]) or x["metrics"].get("broke_down"))]
        if flags:
            add("Saturated or broken-down runs: " + ", ".join(
                f"{x['config']} rep {x['rep'] + 1}{' step ' + str(x['step']) if x['step'] is not None else ''}" for x in flags) + ".")
            add("")
    xc = [x for x in r["runs"] if x["workload"] == "cross-check"]
    if xc:
        add("")
        add("## Cross-check with Kafka's own tools")
        add("")
        add(f"`org.apache.kafka.tools.ProducerPerformance` ({xc[0]['metrics']['records']:,} records of 1 KiB, --throughput -1, acks=all, "
            "batch.size=131072, linger.ms=5, the Java client's other defaults: idempotence on, 1 connection) and "
            "`ConsumerPerformance` (reads them back through a consumer group), first repetition only, beside the bench "
            "client's closed-loop figure for the same broker.")
        add("")
        add("| broker | ProducerPerformance MB/s | its p50 / p99 / p99.9 / max (ms) | bench client max MB/s | ConsumerPerformance fetch MB/s |")
        add("|---|---|---|---|---|")
        for x in xc:
            mm = x["metrics"]
            bench = get(summary, "max-throughput", None, "throughput_mbps", x["config"])
            pp = fmt(mm.get("pp_throughput_mbps")) if "pp_throughput_mbps" in mm else mm.get("producer_performance", "n/a")
            lat = (f"{fmt(mm.get('pp_p50_ms'))} / {fmt(mm.get('pp_p99_ms'))} / {fmt(mm.get('pp_p999_ms'))} / {fmt(mm.get('pp_max_ms'))}"
                   if "pp_p50_ms" in mm else "n/a")
            cp = fmt(mm.get("cp_fetch_mbps")) if "cp_fetch_mbps" in mm else mm.get("consumer_performance", "n/a")
            add(f"| {x['config']} | {pp} | {lat} | {cell(bench)} | {cp} |")
    if r["plots"]:
        add("")
        add("## Plots")
        add("")
        for p in r["plots"]:
            add(f"![{Path(p).stem}]({p})")
            add("")
    if r["flamegraphs"]:
        add("## Flame graphs")
        add("")
        add("ferrolog only, in a session of its own after the measured phases (perf's sampling costs none of the figures above): "
            "every broker thread's on-CPU stacks, user and kernel, sampled by `perf record --call-graph dwarf` while the "
            "workload ran as in its phase. Width is the share of samples; the thread is the bottom frame. The table lists "
            "the functions most often on CPU themselves (innermost frame).")
        add("")
        for f in r["flamegraphs"]:
            add(f"### {f['workload']}: {f['samples']:,} samples")
            add("")
            add(f"![flame-{f['workload']}]({f['svg']})")
            add("")
            add("| function (on CPU itself) | share of samples |")
            add("|---|---|")
            for t in f["top_self"]:
                add(f"| `{t['function'].replace('|', '/')}` | {t['percent']:.1f}% |")
            add("")
    add("## Configuration")
    add("")
    add(f"- ferrolog: `--cores {r['ferrolog_cores']}`, defaults otherwise (fsync before acknowledging acks=all).")
    if r["pinned"]:
        add("- Pinned (`--pinned`): every broker process on CPU 0 only, the load generator on CPU 1 only (CPU affinity, "
            "inherited by every thread), so broker and client do not compete for a core.")
    add(f"- Apache Kafka: single-node KRaft (broker+controller), JVM `{h.machine.get('java')}`, heap `-Xms1g -Xmx1g`, G1 "
        "(scripts/start-apache-kafka.sh); `kafka-flush` adds `log.flush.interval.messages=1`.")
    add(f"- Fixed rates are fractions of {fmt(r['kafka_reference_rps'])} records/s (Kafka default mode, median closed-loop max).")
    add("- Load generator: `ferrolog-bench` (bench/), Kafka protocol via kafka-protocol, its own v2 record batches "
        "(CRC32C, no compression, no idempotence), API versions: "
        + "; ".join(f"{c}: " + ", ".join(f"{k} v{v}" for k, v in sorted(vs.items())) for c, vs in r["api_versions"].items()) + ".")
    for c, s in r["settings"].items():
        if "jvm_cmdline" in s:
            add(f"- {c} JVM command line: `{' '.join(s['jvm_cmdline'][:12])} …`")
        if "server.properties" in s:
            add(f"- {c} server.properties: `{'`, `'.join(x for x in s['server.properties'] if not x.startswith(('listeners', 'advertised', 'controller.quorum', 'log.dirs')))}`")
    add("- Workload parameters: see `profile` in results.json.")
    if r["errors"]:
        add("")
        add("## Errors")
        add("")
        for e in r["errors"]:
            first = e["error"].strip().splitlines()[0] if e["error"].strip() else ""
            add(f"- {e['workload']} on {e['config']} (rep {e['rep'] + 1}): {first[:400]}")
    add("")
    add("Raw per-run JSON (timelines, percentile curves, options) is under `raw/`; every figure above is in `results.json`.")
    add("")
    return "\n".join(L)
