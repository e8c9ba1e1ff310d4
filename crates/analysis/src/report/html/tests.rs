use super::*;

fn page_of(name: &str) -> (Report, String) {
    let ev = crate::analyse::fixture(name);
    let r = crate::report::build(&ev);
    let page = render(&r, &View::build(&r, &ev));
    (r, page)
}

#[test]
fn escapes_markup() {
    assert_eq!(
        escape("<a href=\"x\">&'"),
        "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
    );
}

#[test]
fn script_json_cannot_end_its_element() {
    let s = script_json(&serde_json::json!({"q": "</script><script>alert(1)</script>&\u{2028}"}));
    assert!(
        !s.contains('<') && !s.contains('>') && !s.contains('&'),
        "{s}"
    );
    assert!(!s.contains('\u{2028}'), "{s}");
    let back: serde_json::Value = serde_json::from_str(&s).unwrap();
    assert_eq!(back["q"], "</script><script>alert(1)</script>&\u{2028}");
}

// The real stall recording: its critical finding with its window, the
// panels it recorded, the ones it did not said so.
#[test]
fn the_stall_recording_as_a_page() {
    let (_, page) = page_of("pg15-checkpoint-stall");
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.ends_with("</body></html>\n"));
    assert!(page.contains("data-finding=\"checkpoint-writeback-stall\""));
    assert!(page.contains("class=\"finding critical\""));
    for name in [
        "throughput",
        "latency",
        "states",
        "writeback",
        "checkpoints",
    ] {
        assert!(page.contains(&format!("data-chart=\"{name}\"")), "{name}");
    }
    for name in ["syscalls", "waits", "replay-lag"] {
        assert!(
            page.contains(&format!("data-not-recorded=\"{name}\"")),
            "{name}"
        );
    }
    let card = &page[page
        .find("data-finding=\"checkpoint-writeback-stall\"")
        .unwrap()..];
    assert!(card[..300].contains("data-window=\""), "{}", &card[..300]);
    // Deterministic.
    let (_, again) = page_of("pg15-checkpoint-stall");
    assert_eq!(page, again);
}

// Every script and style in the page is allowed by a hash in its policy,
// and nothing else is.
#[test]
fn the_policy_allows_only_the_pages_own_code() {
    let (_, page) = page_of("pg13-drop-many-sweep");
    let csp_at = page.find("Content-Security-Policy\" content=\"").unwrap();
    let csp = &page[csp_at..page[csp_at..].find("\">").unwrap() + csp_at];
    assert!(csp.contains("default-src &#39;none&#39;"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    let scripts: Vec<&str> = page
        .split("<script>")
        .skip(1)
        .map(|s| &s[..s.find("</script>").unwrap()])
        .collect();
    assert_eq!(scripts.len(), 2);
    for s in scripts {
        assert!(csp.contains(&sha256(s).replace('\'', "&#39;")));
    }
    // One flame graph per profiled role, each its own document, no inline
    // handler left.
    assert!(page.matches("data-chart=\"flamegraph-").count() > 1);
    let at = page.find("data-chart=\"flamegraph-startup\"").unwrap();
    let src = &page[at..];
    let src = &src[src.find("src=\"data:image/svg+xml;base64,").unwrap() + 31..];
    let svg = base64_decode(&src[..src.find('"').unwrap()]).unwrap();
    let svg = String::from_utf8(svg).unwrap();
    assert!(!svg.contains("onload="), "inline handler left");
    assert!(svg.contains("DropRelFileNodesAllBuffers"));
    assert!(svg.trim_end().ends_with("</svg>"));
}

// An attach recording has no pgbench: the server's throughput and the
// statements' latency are drawn, the checkpoint from the counters shaded.
#[test]
fn an_attach_recording_charts_the_servers_series() {
    let (r, page) = page_of("pg15-attach-counters-checkpoint");
    assert!(r.workload.is_none());
    for name in ["throughput", "latency", "waits", "checkpoints"] {
        assert!(page.contains(&format!("data-chart=\"{name}\"")), "{name}");
    }
    assert!(page.contains("checkpoint"), "no checkpoint");
    assert!(page.contains("(counters)"), "no counter checkpoint window");
}

#[test]
fn panels_align_their_series() {
    let ev = crate::analyse::fixture("pg13-select-only-timeout-all");
    let r = crate::report::build(&ev);
    let panels = View::build(&r, &ev).panels;
    let names: Vec<&str> = panels.iter().map(|p| p.name).collect();
    for n in [
        "throughput",
        "latency",
        "states",
        "waits",
        "writeback",
        "syscalls",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    for p in &panels {
        assert!(p.x.windows(2).all(|w| w[0] < w[1]), "{}", p.name);
        assert_eq!(p.ys.len(), p.labels.len(), "{}", p.name);
        assert!(p.ys.iter().all(|c| c.len() == p.x.len()), "{}", p.name);
    }
}

// Profile and offcpu both recorded: per role an on-CPU and a combined
// graph, whose first frames are both sides (the off-CPU graph is in it);
// offcpu alone: an off-CPU graph.
#[test]
fn on_and_off_cpu_graphs_per_role() {
    let (_, page) = page_of("pg13-select-only-on-off-cpu");
    assert!(!page.contains("data-chart=\"offcpu-flamegraph-"));
    for name in ["flamegraph-backend", "combined-flamegraph-backend"] {
        assert!(
            page.contains(&format!("data-chart=\"{name}\"")),
            "{name} missing"
        );
    }
    let at = page
        .find("data-chart=\"combined-flamegraph-backend\"")
        .unwrap();
    let src = &page[at..];
    let src = &src[src.find("src=\"data:image/svg+xml;base64,").unwrap() + 31..];
    let svg = base64_decode(&src[..src.find('"').unwrap()]).unwrap();
    let svg = String::from_utf8(svg).unwrap();
    for frame in ["on-CPU", "off-CPU S", "off-CPU runq", "PostgresMain"] {
        assert!(svg.contains(frame), "{frame} not in the combined graph");
    }
    let (_, page) = page_of("pg15-checkpoint-stall-offcpu");
    assert!(page.contains("data-chart=\"offcpu-flamegraph-checkpointer\""));
    assert!(!page.contains("data-chart=\"combined-flamegraph-"));
    // Without offcpu (the lab fixture): on-CPU graphs only.
    let (_, page) = page_of("pg13-select-only-timeout-all");
    assert!(!page.contains("data-chart=\"combined-flamegraph-"));
    assert!(!page.contains("data-chart=\"offcpu-flamegraph-"));
}

// The fsync collector's flush latency: a table and one histogram figure
// with a bar per non-empty bucket; none without the collector.
#[test]
fn fsync_latency_histogram() {
    let (r, page) = page_of("pg15-wal-slow-fsync");
    let s = r.fsync.as_ref().unwrap();
    assert_eq!(page.matches("data-chart=\"fsync-latency\"").count(), 1);
    assert!(page.contains("Flush latency in the kernel"));
    let bars: usize = s
        .roles
        .iter()
        .map(|x| x.buckets.iter().filter(|n| **n > 0).count())
        .sum();
    let at = page.find("data-chart=\"fsync-latency\"").unwrap();
    let fig = &page[at..at + page[at..].find("</figure>").unwrap()];
    assert_eq!(fig.matches("<rect").count(), bars);
    let (_, page) = page_of("pg15-attach-wal-slow-device");
    assert!(!page.contains("data-chart=\"fsync-latency\""));
}

// A real run whose run-queue figure passed its bound with the cluster
// itself filling the CPUs: the page says why it was not raised.
#[test]
fn a_check_held_back_says_why() {
    let (r, page) = page_of("pg15-noisy-neighbour-none-quiet");
    let c = r
        .checks
        .iter()
        .find(|c| c.id == "cpu-saturation")
        .expect("the check");
    let why = c.held_back.as_deref().expect("held back");
    assert!(page.contains("(not raised: "), "no reason in the page");
    assert!(page.contains(&escape(why)), "{why}");
}

// The real slow-reads run: each role's bar and its time over the
// recording, the backends' blocked layer named with its mean.
#[test]
fn the_account_shows_each_roles_time_over_the_recording() {
    let (r, page) = page_of("pg15-disk-read-latency-150");
    let a = r.account.as_ref().expect("an account");
    let areas = page.matches("<svg class=\"account-area\"").count();
    let with_points = a.roles.iter().filter(|r| r.over_time.len() >= 2).count();
    assert!(with_points >= 2, "{with_points} roles with points");
    assert_eq!(areas, with_points, "one area per role with points");
    let start = page.find("<svg class=\"account-area\"").unwrap();
    let backends = &page[start..start + page[start..].find("</svg>").unwrap()];
    assert!(
        backends.contains("<title>blocked (D): ") && backends.contains("processes on average"),
        "{backends}"
    );
    assert!(backends.matches("<polygon").count() >= 2, "{backends}");
}

fn base64_decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text)
}

/// A recording with the query timeline and the offcpu collector (PG 13
/// select-only): the queries section lists each query's kernel time, and
/// the top query's off-CPU flame graph opens from its `<details>`.
#[test]
fn queries_by_kernel_time_with_a_flame_graph_each() {
    let (r, page) = page_of("pg13-select-only-on-off-cpu");
    assert!(!r.queries.is_empty());
    let section = &page[page
        .find("<section id=\"queries\">")
        .expect("a queries section")..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(
        section.contains(&escape(&r.queries[0].query_id)),
        "{section}"
    );
    assert!(section.contains("<th>run queue</th>"), "{section}");
    let details = section.matches("<details class=\"query-flames\"").count();
    assert!(
        (1..=crate::report::view::QUERY_FLAMES).contains(&details),
        "{details}"
    );
    assert!(
        section.contains("data-chart=\"query-offcpu-flamegraph-1\""),
        "no off-CPU flame graph of the first query"
    );
    // Without the query timeline there is no section.
    let (r, page) = page_of("pg15-checkpoint-stall");
    assert!(r.queries.is_empty());
    assert!(!page.contains("<section id=\"queries\">"));
}
