//! Flame graphs of a broker from `perf script` output: stacks folded into one line per
//! distinct stack (root first, `;`-separated, with its sample count), drawn as an SVG flame
//! graph (one box per frame, as wide as its share of the samples, callers below callees),
//! plus the functions that were on CPU themselves most often, for the report's table.
//!
//! The harness records the broker with `perf record --call-graph dwarf` while a workload
//! runs and passes `perf script` output here; the stacks carry kernel frames too, so time
//! in syscalls, io_uring and the network stack shows under the thread that spent it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// Folded stacks: `thread;outermost;...;innermost` -> samples.
pub type Folded = BTreeMap<String, u64>;

/// Folds `perf script` output (samples separated by blank lines: a header line naming the
/// thread, then one line per frame, innermost first).
pub fn fold(perf_script: &str) -> Folded {
    let mut folded = Folded::new();
    for sample in perf_script.split("\n\n") {
        let mut lines = sample.lines().filter(|l| !l.trim().is_empty());
        let Some(header) = lines.next() else {
            continue;
        };
        let thread = thread_name(header);
        let mut frames: Vec<String> = lines.filter_map(frame_name).collect();
        frames.push(thread);
        frames.reverse();
        *folded.entry(frames.join(";")).or_default() += 1;
    }
    folded
}

/// The thread's name from a sample's header (`name  pid/tid  time: ...`), with a trailing
/// number (a worker's id) cut off so that a pool of threads folds into one.
fn thread_name(header: &str) -> String {
    // The name may hold spaces; it ends where the pid field (digits, maybe `/tid`) starts.
    let fields: Vec<&str> = header.split_whitespace().collect();
    let pid_at = fields
        .iter()
        .position(|f| {
            f.split('/')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .unwrap_or(1.min(fields.len()));
    let name = fields[..pid_at].join(" ");
    let trimmed = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let trimmed = trimmed.trim_end_matches(['-', '_', '/']);
    if trimmed.is_empty() {
        name
    } else {
        trimmed.to_string()
    }
}

/// A frame line (`address symbol+offset (object)`) as `symbol`, or the object when the
/// symbol is unknown. `;` would split the folded line, so it is replaced.
fn frame_name(line: &str) -> Option<String> {
    let line = line.trim();
    let (_, rest) = line.split_once(char::is_whitespace)?;
    let rest = rest.trim();
    let (symbol, object) = match rest.rfind(" (") {
        Some(i) if rest.ends_with(')') => (&rest[..i], &rest[i + 2..rest.len() - 1]),
        _ => (rest, ""),
    };
    let symbol = match symbol.rfind("+0x") {
        Some(i) => &symbol[..i],
        None => symbol,
    };
    let name = if symbol.is_empty() || symbol == "[unknown]" {
        match object.rsplit('/').next().unwrap_or(object) {
            "" => "[unknown]".to_string(),
            o if o.starts_with('[') => o.to_string(),
            o => format!("[{o}]"),
        }
    } else {
        symbol.to_string()
    };
    Some(name.replace(';', ":"))
}

/// One function's samples as the innermost frame.
#[derive(Serialize, Debug, PartialEq)]
pub struct SelfTime {
    pub function: String,
    pub samples: u64,
    pub percent: f64,
}

/// The `n` functions most often innermost (on CPU themselves), most first.
pub fn top_self(folded: &Folded, n: usize) -> Vec<SelfTime> {
    let total: u64 = folded.values().sum();
    let mut by_leaf: BTreeMap<&str, u64> = BTreeMap::new();
    for (stack, count) in folded {
        let leaf = stack.rsplit(';').next().unwrap_or(stack);
        *by_leaf.entry(leaf).or_default() += count;
    }
    let mut top: Vec<(&str, u64)> = by_leaf.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    top.into_iter()
        .take(n)
        .map(|(f, samples)| SelfTime {
            function: f.to_string(),
            samples,
            percent: 100.0 * samples as f64 / total.max(1) as f64,
        })
        .collect()
}

#[derive(Default)]
struct Node {
    samples: u64,
    children: BTreeMap<String, Node>,
}

const WIDTH: f64 = 1200.0;
const FRAME_HEIGHT: f64 = 16.0;
const TOP_MARGIN: f64 = 40.0;
/// Frames narrower than this (pixels) are left out, with their callees.
const MIN_WIDTH: f64 = 0.3;
const CHAR_WIDTH: f64 = 6.5;

/// An SVG flame graph of `folded` (empty but valid when there are no samples).
pub fn svg(folded: &Folded, title: &str) -> String {
    let mut root = Node::default();
    for (stack, &count) in folded {
        root.samples += count;
        let mut node = &mut root;
        for frame in stack.split(';') {
            node = node.children.entry(frame.to_string()).or_default();
            node.samples += count;
        }
    }
    let depth = max_depth(&root, root.samples);
    let height = TOP_MARGIN + (depth as f64 + 1.0) * FRAME_HEIGHT + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">"#
    );
    out.push_str(r##"<rect width="100%" height="100%" fill="#f8f8f0"/>"##);
    out.push('\n');
    let _ = writeln!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="15">{} ({} samples)</text>"#,
        WIDTH / 2.0,
        escape(title),
        root.samples
    );
    if root.samples > 0 {
        let scale = WIDTH / root.samples as f64;
        let mut x = 0.0;
        for (name, child) in &root.children {
            draw(&mut out, name, child, x, 0, scale, root.samples, height);
            x += child.samples as f64 * scale;
        }
    }
    out.push_str("</svg>\n");
    out
}

fn max_depth(node: &Node, total: u64) -> usize {
    node.children
        .values()
        .filter(|c| c.samples as f64 * WIDTH / total.max(1) as f64 >= MIN_WIDTH)
        .map(|c| 1 + max_depth(c, total))
        .max()
        .unwrap_or(0)
}

#[allow(clippy::too_many_arguments)]
fn draw(
    out: &mut String,
    name: &str,
    node: &Node,
    x: f64,
    depth: usize,
    scale: f64,
    total: u64,
    height: f64,
) {
    let w = node.samples as f64 * scale;
    if w < MIN_WIDTH {
        return;
    }
    let y = height - 10.0 - (depth as f64 + 1.0) * FRAME_HEIGHT;
    let pct = 100.0 * node.samples as f64 / total as f64;
    let _ = writeln!(
        out,
        r#"<g><title>{} ({} samples, {pct:.2}%)</title><rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{}" fill="{}" rx="2"/>"#,
        escape(name),
        node.samples,
        FRAME_HEIGHT - 1.0,
        color(name)
    );
    let chars = ((w - 6.0) / CHAR_WIDTH).floor() as usize;
    if chars >= 3 {
        let label: String = if name.chars().count() > chars {
            name.chars().take(chars - 2).collect::<String>() + ".."
        } else {
            name.to_string()
        };
        let _ = writeln!(
            out,
            r#"<text x="{:.2}" y="{:.1}">{}</text>"#,
            x + 3.0,
            y + FRAME_HEIGHT - 4.5,
            escape(&label)
        );
    }
    out.push_str("</g>\n");
    let mut cx = x;
    for (child_name, child) in &node.children {
        draw(out, child_name, child, cx, depth + 1, scale, total, height);
        cx += child.samples as f64 * scale;
    }
}

/// Warm colours, the same for the same name; kernel frames (no `::`, lower case) redder.
fn color(name: &str) -> String {
    let h = name
        .bytes()
        .fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619));
    let r = 205 + (h % 50);
    let g = 80 + ((h >> 8) % 130);
    let b = (h >> 16) % 55;
    format!("rgb({r},{g},{b})")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "\
ferrolog-shard- 1234/1240 100.000001: 10101010 cpu-clock:
\tffffffff81000001 copy_user_generic+0x11 ([kernel.kallsyms])
\tffffffff81000002 tcp_sendmsg+0x22 ([kernel.kallsyms])
\t55555555 ferrolog::kafka::server::connection::{{closure}}+0x33 (/bin/ferrolog)

ferrolog-shard- 1234/1240 100.000002: 10101010 cpu-clock:
\tffffffff81000001 copy_user_generic+0x11 ([kernel.kallsyms])
\tffffffff81000002 tcp_sendmsg+0x22 ([kernel.kallsyms])
\t55555555 ferrolog::kafka::server::connection::{{closure}}+0x33 (/bin/ferrolog)

iou-wrk-1250 1234/1250 100.000003: 10101010 cpu-clock:
\tffffffff81000003 ext4_sync_file+0x1 ([kernel.kallsyms])
\t7f0000 [unknown] (/usr/lib/libc.so.6)
\t7f0001 [unknown] ([unknown])
";

    #[test]
    fn folds_stacks_root_first_per_thread_pool() {
        let f = fold(SCRIPT);
        assert_eq!(f.len(), 2);
        assert_eq!(
            f["ferrolog-shard;ferrolog::kafka::server::connection::{{closure}};tcp_sendmsg;copy_user_generic"],
            2
        );
        assert_eq!(f["iou-wrk;[unknown];[libc.so.6];ext4_sync_file"], 1);
        let top = top_self(&f, 5);
        assert_eq!(top[0].function, "copy_user_generic");
        assert_eq!(top[0].samples, 2);
        assert!((top[0].percent - 66.666).abs() < 0.01);
    }

    #[test]
    fn draws_one_box_per_frame_in_valid_svg() {
        let s = svg(&fold(SCRIPT), "a <test>");
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        // Threads (2), then the frames under them (3 + 3).
        assert_eq!(s.matches("<rect x=").count(), 8);
        assert!(s.contains("a &lt;test&gt; (3 samples)"));
        assert!(svg(&Folded::new(), "empty").contains("(0 samples)"));
    }
}
