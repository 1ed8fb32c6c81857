"""Smoke test of the benchmark harness: `scripts/bench.sh --quick` against ferrolog and
Apache Kafka, then checks that the report, the JSON and the plots are well formed.

It never judges a speed (bench/ does that, in its reports). It fails when the harness
breaks: a workload that no longer runs against either broker, a report section or a
JSON field that went missing, a plot that is not an SVG.
"""

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support import REPO_ROOT

# The quick mode itself aims at under 6 minutes (three 3-node clusters included); the margin
# is for a loaded CI machine.
QUICK_TIMEOUT_S = 720

WORKLOADS = ["startup", "max-throughput", "max-throughput-ramp", "max-throughput-sustainable",
             "fixed-rate", "fan-out", "many-producers", "keyed", "drain-while-producing", "catch-up", "catch-up-cold", "many-partitions", "cross-check",
             "replicated-throughput", "replicated-fixed-rate", "replicated-many-partitions"]
CONFIGS = ["ferrolog", "kafka", "kafka-flush"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick"
    work = tmp_path_factory.mktemp("bench-work")
    # The load generator is not part of the default `cargo build` of the workspace root.
    build = subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "ferrolog-bench"], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stderr[-3000:]
    env = dict(os.environ)
    proc = subprocess.run([str(REPO_ROOT / "scripts/bench.sh"), "--quick", "--no-build", "--out", str(out), "--work-dir", str(work)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=QUICK_TIMEOUT_S, env=env)
    return proc, out


def test_quick_run_exits_cleanly(quick_run):
    proc, out = quick_run
    assert proc.returncode == 0, f"bench.sh --quick exited {proc.returncode}:\n{proc.stderr[-4000:]}"


def test_results_json_is_complete(quick_run):
    _, out = quick_run
    r = json.loads((out / "results.json").read_text())
    assert r["quick"] is True
    assert r["errors"] == [], r["errors"]
    assert r["configs"] == CONFIGS
    for key in ("machine", "hardware", "hardware_percentages", "settings", "headline", "summary", "runs", "plots"):
        assert key in r, key
    hw = r["hardware"]
    for key in ("direct_write_mbps", "direct_read_mbps", "loopback_tcp_mbps"):
        assert hw[key] > 0, key
    assert hw["fdatasync_direct_4k"]["count"] > 0
    seen = {(x["workload"], x["config"]) for x in r["runs"]}
    missing = [(w, c) for w in WORKLOADS for c in CONFIGS if (w, c) not in seen]
    assert not missing, f"workloads without a result: {missing}"
    # Every run that names a raw file has one, and it parses.
    for x in r["runs"]:
        if x.get("raw"):
            json.loads((out / x["raw"]).read_text())
    # The headline compares ferrolog with both Kafka modes on the throughput line.
    top = r["headline"][0]
    assert top["metric"] == "throughput_mbps"
    for c in CONFIGS:
        assert top[c] and top[c]["median"] > 0, c
    assert top["ferrolog_advantage_vs_kafka"] is not None
    assert top["ferrolog_advantage_vs_kafka-flush"] is not None
    # Broker CPU per GiB is split: the kernel part is measured and within the whole.
    for x in r["runs"]:
        if x["workload"] in ("max-throughput", "catch-up", "catch-up-cold"):
            m = x["metrics"]
            assert m["broker_kernel_cpu_s_per_gib"] is not None, (x["workload"], x["config"])
            # (A quick run's read can take under one clock tick of kernel time.)
            assert 0 <= m["broker_kernel_cpu_s_per_gib"] <= m["broker_cpu_s_per_gib"], (x["workload"], x["config"], m)
    # The drain is timed and its worst second's produce p99 found; every run records how
    # busy the load generator was.
    for x in r["runs"]:
        if x["workload"] == "drain-while-producing":
            assert x["metrics"]["drain_mbps"] > 0 and x["metrics"]["drain_worst_second_p99_ms"] is not None, x
        if x["workload"] in ("max-throughput", "fixed-rate", "keyed", "many-producers"):
            assert x["metrics"]["client_cpu_pct"] >= 0, x
    # Kafka's JVM settings are recorded, as the report must state them.
    assert any("-Xmx1g" in a for a in r["settings"]["kafka"]["jvm_cmdline"])


def test_report_is_well_formed(quick_run):
    _, out = quick_run
    md = (out / "report.md").read_text()
    for heading in ("## Headline", "## Hardware limits", "### startup", "### max-throughput", "### fixed-rate", "### fan-out", "### many-producers", "### keyed", "### drain-while-producing",
                    "### catch-up", "### catch-up, page cache dropped", "### many-partitions", "### replicated: throughput",
                    "### replicated: many partitions", "## Cross-check", "## Plots", "## Flame graphs", "## Configuration"):
        assert heading in md, heading
    assert "## Errors" not in md
    # Markdown tables: every row of a table has as many cells as its header.
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            width = line.count("|")
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                assert lines[j].count("|") == width, f"ragged table row: {lines[j]}"
                j += 1


def test_plots_are_svg_and_linked(quick_run):
    _, out = quick_run
    r = json.loads((out / "results.json").read_text())
    md = (out / "report.md").read_text()
    assert len(r["plots"]) >= 4
    for p in r["plots"]:
        path = out / p
        root = ET.parse(path).getroot()
        assert root.tag.endswith("svg"), p
        assert f"]({p})" in md, f"{p} not linked from the report"


def test_flame_graphs_show_the_brokers_own_frames(quick_run):
    _, out = quick_run
    r = json.loads((out / "results.json").read_text())
    md = (out / "report.md").read_text()
    flames = {f["workload"]: f for f in r["flamegraphs"]}
    assert set(flames) == {"max-throughput", "catch-up"}
    for name, f in flames.items():
        assert f["samples"] > 0 and f["top_self"], name
        root = ET.parse(out / f["svg"]).getroot()
        assert root.tag.endswith("svg"), name
        boxes = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
        assert len(boxes) > 20, (name, len(boxes))
        # perf unwound through the broker's own code (DWARF), and into the kernel.
        assert any(b.startswith("ferrolog") and "::" in b for b in boxes), (name, boxes[:20])
        assert any(b.startswith(("__x64_sys", "do_syscall", "entry_SYSCALL", "io_")) for b in boxes), (name, boxes[:20])
        assert f"]({f['svg']})" in md, name
