//! Flame graphs for the page: inferno's SVG, each embedded as its own
//! document (an `<iframe>` on a `data:` URL) so inferno's own script keeps
//! its search and zoom, several graphs do not share its globals, and the
//! SVG is parsed as SVG. The page's Content-Security-Policy is inherited by
//! those documents: inferno's `onload` attribute (an inline handler the
//! policy blocks) is replaced by a script at the end of the SVG, and every
//! script and style of the SVG is allowed by its hash.
use std::collections::BTreeMap;
use std::io::BufReader;

use super::{escape, Csp};
use crate::report::sections::profile::FoldedStack;

/// Does what inferno's `onload="init(evt)"` did, once the document is
/// loaded and laid out (its fluid width is read then; 0 before), and keeps
/// inferno's resize handler from a 0-wide frame (it would set a negative
/// width). The zoom state inferno keeps in the URL cannot be kept in a
/// `data:` document: that call is a no-op.
const INIT: &str = "history.replaceState=function(){};\
function w(){return document.documentElement.getBoundingClientRect().width}\
window.addEventListener(\"resize\",function(e){if(w()<=0)e.stopImmediatePropagation()},true);\
(function go(){if(document.readyState===\"complete\"&&w()>0){init(null)}else{setTimeout(go,20)}})();";

/// Folded lines (`frame;…;frame count`) per role, roles in name order.
pub fn by_role(stacks: &[FoldedStack]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in stacks {
        if s.frames.is_empty() {
            continue;
        }
        out.entry(s.role.clone()).or_default().push(format!(
            "{} {}",
            s.frames.join(";"),
            s.samples
        ));
    }
    out
}

/// An inferno SVG from folded lines (one or two counts per line) whose
/// counts are `count_name` (shown on hover).
fn svg(title: &str, subtitle: &str, count_name: &str, lines: &[String]) -> Option<String> {
    let mut out = Vec::new();
    let mut opt = crate::report::view::profile::flame_options(title, subtitle);
    opt.count_name = count_name.into();
    inferno::flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), &mut out).ok()?;
    String::from_utf8(out).ok()
}

/// The differential flame graph of B against A: B's stacks, coloured red
/// where B spent more samples than A, blue where fewer (A normalised to B's
/// total so a change in load does not colour everything).
fn diff_svg(title: &str, subtitle: &str, a: &[String], b: &[String]) -> Option<String> {
    let mut folded = Vec::new();
    let opt = inferno::differential::Options {
        normalize: true,
        strip_hex: false,
    };
    let (ta, tb) = (a.join("\n"), b.join("\n"));
    inferno::differential::from_readers(
        opt,
        BufReader::new(ta.as_bytes()),
        BufReader::new(tb.as_bytes()),
        &mut folded,
    )
    .ok()?;
    let lines: Vec<String> = String::from_utf8(folded)
        .ok()?
        .lines()
        .map(str::to_string)
        .collect();
    svg(title, subtitle, "samples", &lines)
}

fn between<'a>(s: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let i = s.find(open)? + open.len();
    let j = s[i..].find(close)?;
    Some(&s[i..i + j])
}

/// The SVG made fit for the policy, and its `height` attribute.
fn embed(svg: &str, csp: &mut Csp) -> Option<(String, u32)> {
    let root = between(svg, "<svg ", ">")?;
    let height: u32 = between(root, "height=\"", "\"")?.parse().ok()?;
    let script = between(svg, "<script type=\"text/ecmascript\">", "</script>")?;
    csp.script(&script.replace("<![CDATA[", "").replace("]]>", ""));
    csp.script(INIT);
    if let Some(style) = between(svg, "<style type=\"text/css\">", "</style>") {
        csp.style(style);
    }
    let end = svg.rfind("</svg>")?;
    let out = format!(
        // CDATA: the SVG is XML (`&&`); the hash is of the text inside.
        "{}<script type=\"text/ecmascript\"><![CDATA[{INIT}]]></script></svg>",
        &svg[..end]
    )
    .replacen(" onload=\"init(evt)\"", "", 1);
    Some((out, height))
}

/// The `<iframe>` of one graph, `data-chart` named.
fn frame(name: &str, title: &str, svg: &str, csp: &mut Csp) -> Option<String> {
    use super::base64_block as encode_block;
    let (doc, height) = embed(svg, csp)?;
    Some(format!(
        "<iframe class=\"flame\" data-chart=\"{}\" title=\"{}\" height=\"{height}\" src=\"data:image/svg+xml;base64,{}\"></iframe>",
        escape(name),
        escape(title),
        encode_block(doc.as_bytes()).replace(['\n', '\r'], "")
    ))
}

/// What a set of folded stacks shows: its `data-chart` prefix, the title
/// before the role, and how its weights are counted.
pub struct Kind {
    pub chart: &'static str,
    pub title: &'static str,
    pub subtitle: fn(u64) -> String,
    /// What a count is, on hover.
    pub count_name: &'static str,
}

pub const ON_CPU: Kind = Kind {
    chart: "flamegraph",
    title: "on-CPU",
    subtitle: |n| format!("{n} samples"),
    count_name: "samples",
};
pub const OFF_CPU: Kind = Kind {
    chart: "offcpu-flamegraph",
    title: "off-CPU",
    subtitle: |us| {
        format!(
            "{:.3} s switched out, by state (blocks ≥ the minimum)",
            us as f64 / 1e6
        )
    },
    count_name: "µs",
};
pub const COMBINED: Kind = Kind {
    chart: "combined-flamegraph",
    title: "on- and off-CPU",
    subtitle: |us| {
        format!(
            "{:.3} s: on-CPU samples ÷ frequency + off-CPU blocks",
            us as f64 / 1e6
        )
    },
    count_name: "µs",
};

/// One flame graph per role: `(role, iframe)`.
pub fn per_role(stacks: &[FoldedStack], kind: &Kind, csp: &mut Csp) -> Vec<(String, String)> {
    by_role(stacks)
        .into_iter()
        .filter_map(|(role, lines)| {
            let n: u64 = lines
                .iter()
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
                .sum();
            let title = format!("{}: {role}", kind.title);
            let svg = svg(&title, &(kind.subtitle)(n), kind.count_name, &lines)?;
            let f = frame(&format!("{}-{role}", kind.chart), &title, &svg, csp)?;
            Some((role, f))
        })
        .collect()
}

/// One flame graph of `stacks` (any role) named `chart`, titled `title`.
pub fn one(
    stacks: &[FoldedStack],
    chart: &str,
    title: &str,
    kind: &Kind,
    csp: &mut Csp,
) -> Option<String> {
    let lines: Vec<String> = stacks
        .iter()
        .filter(|s| !s.frames.is_empty())
        .map(|s| format!("{} {}", s.frames.join(";"), s.samples))
        .collect();
    if lines.is_empty() {
        return None;
    }
    let n: u64 = stacks.iter().map(|s| s.samples).sum();
    let svg = svg(title, &(kind.subtitle)(n), kind.count_name, &lines)?;
    frame(chart, title, &svg, csp)
}

/// One differential flame graph per role either side profiled.
pub fn differential(a: &[FoldedStack], b: &[FoldedStack], csp: &mut Csp) -> Vec<(String, String)> {
    let (ra, rb) = (by_role(a), by_role(b));
    let roles: std::collections::BTreeSet<&String> = ra.keys().chain(rb.keys()).collect();
    let empty = Vec::new();
    roles
        .into_iter()
        .filter_map(|role| {
            let (la, lb) = (
                ra.get(role).unwrap_or(&empty),
                rb.get(role).unwrap_or(&empty),
            );
            let title = format!("on-CPU: {role}, B against A");
            let svg = diff_svg(
                &title,
                "red: more samples in B, blue: fewer (A normalised to B's total)",
                la,
                lb,
            )?;
            let f = frame(&format!("diff-flamegraph-{role}"), &title, &svg, csp)?;
            Some((role.clone(), f))
        })
        .collect()
}
