//! Query texts of `pg_stat_activity` with their parameters taken out, and
//! a fingerprint of what is left, for servers without `query_id` (before
//! PostgreSQL 14, or `compute_query_id` off or `auto` without
//! pg_stat_statements loaded).
//!
//! A lexer, not a parser: `pg_stat_activity.query` is cut at
//! `track_activity_query_size` bytes (1 KiB by default), so a text often
//! does not parse; libpg_query (pg_query) would reject exactly those, and
//! needs a C build of PostgreSQL's parser. What is replaced: string
//! constants of every kind ('…', E'…', B'…', X'…', U&'…', $tag$…$tag$),
//! numbers, `$n` parameters (each becomes `?`); lists of them after `IN`,
//! in `VALUES` rows and in `ARRAY[…]` become `(...)`/`[...]`; comments go
//! (they may carry values too); unquoted words are lower-cased and
//! whitespace collapsed. Quoted identifiers are kept as written.

/// Longest normalized text kept (bytes); longer ones end in `…`.
pub const MAX_TEXT: usize = 2048;

/// `sql` with every constant replaced by `?` (see the module comment).
pub fn normalize(sql: &str) -> String {
    let b = sql.as_bytes();
    let mut toks: Vec<Tok> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'-' && b.get(i + 1) == Some(&b'-') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i = skip_block_comment(b, i);
        } else if c == b'\'' {
            i = skip_quoted(b, i + 1, b'\'', false);
            toks.push(Tok::Const);
        } else if (c == b'e' || c == b'E') && b.get(i + 1) == Some(&b'\'') {
            i = skip_quoted(b, i + 2, b'\'', true);
            toks.push(Tok::Const);
        } else if matches!(c, b'b' | b'B' | b'x' | b'X' | b'n' | b'N')
            && b.get(i + 1) == Some(&b'\'')
        {
            i = skip_quoted(b, i + 2, b'\'', false);
            toks.push(Tok::Const);
        } else if (c == b'u' || c == b'U')
            && b.get(i + 1) == Some(&b'&')
            && b.get(i + 2) == Some(&b'\'')
        {
            i = skip_quoted(b, i + 3, b'\'', false);
            toks.push(Tok::Const);
        } else if c == b'"' {
            let end = skip_quoted(b, i + 1, b'"', false);
            toks.push(Tok::Text(sql[i..end].to_string()));
            i = end;
        } else if c == b'$' {
            if let Some(end) = dollar_quote_end(b, i) {
                i = end;
                toks.push(Tok::Const);
            } else if b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                toks.push(Tok::Const);
            } else {
                toks.push(Tok::Text("$".into()));
                i += 1;
            }
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            i = skip_number(b, i);
            if unary_sign_before(&toks) {
                toks.pop();
            }
            toks.push(Tok::Const);
        } else if is_word(c) {
            let start = i;
            while i < b.len() && (is_word(b[i]) || b[i].is_ascii_digit() || b[i] == b'$') {
                i += 1;
            }
            toks.push(Tok::Word(sql[start..i].to_ascii_lowercase()));
        } else if OPERATOR.contains(&c) {
            // PostgreSQL's operator characters form one operator (`||`, `>=`).
            let start = i;
            while i < b.len()
                && OPERATOR.contains(&b[i])
                && !(b[i] == b'-' && b.get(i + 1) == Some(&b'-'))
                && !(b[i] == b'/' && b.get(i + 1) == Some(&b'*'))
            {
                i += 1;
            }
            toks.push(Tok::Text(sql[start..i].to_string()));
        } else {
            // One character of punctuation (a whole UTF-8 character, so
            // that slicing stays on boundaries).
            let len = utf8_len(c);
            let end = (i + len).min(b.len());
            toks.push(Tok::Text(String::from_utf8_lossy(&b[i..end]).into_owned()));
            i = end;
        }
    }
    collapse_lists(&mut toks);
    render(&toks)
}

/// The W3C `traceparent` a sqlcommenter comment carries in `sql`
/// (`/*…,traceparent='00-<32 hex>-<16 hex>-<2 hex>',…*/`, as OpenTelemetry's
/// sqlcommenter integrations append it), checked for its form; None
/// otherwise. It names a request, not a value of the query, so it is kept
/// where the text's literals are not. A text cut at
/// `track_activity_query_size` loses a comment at its end.
pub fn traceparent(sql: &str) -> Option<String> {
    const KEY: &str = "traceparent='";
    let at = sql.find("/*")?;
    let comment = &sql[at..];
    let start = comment.find(KEY)? + KEY.len();
    let value = &comment[start..];
    let value = &value[..value.find('\'')?];
    // sqlcommenter URL-encodes values; a traceparent needs no escape, but
    // an encoder may still write its dashes as %2D.
    let value = value.replace("%2D", "-").replace("%2d", "-");
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let nonzero = |p: &str| p.bytes().any(|b| b != b'0');
    let ok = parts.len() == 4
        && hex(parts[0], 2)
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
        && nonzero(parts[1])
        && nonzero(parts[2]);
    ok.then(|| value.to_ascii_lowercase())
}

/// A stable 64-bit fingerprint of a normalized text (FNV-1a: the same on
/// every build and machine, unlike std's hasher), as 16 hex digits.
pub fn fingerprint(normalized: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in normalized.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Is the last token a sign that belongs to the number that follows
/// (`x + -5`, `= -5`, `(-5`, `select -5`), not a binary minus (`a - 5`)?
/// PostgreSQL's grammar folds such a sign into the constant, so
/// pg_stat_statements shows `x + $1` for both signs; so must a fingerprint.
fn unary_sign_before(toks: &[Tok]) -> bool {
    let n = toks.len();
    if !matches!(toks.last(), Some(Tok::Text(t)) if t == "-" || t == "+") {
        return false;
    }
    match n.checked_sub(2).map(|k| &toks[k]) {
        None => true,
        Some(Tok::Text(t)) => {
            t == "(" || t == "[" || t == "," || t.bytes().all(|c| OPERATOR.contains(&c))
        }
        Some(Tok::Word(w)) => {
            SPACED.contains(&w.as_str())
                || matches!(w.as_str(), "limit" | "offset" | "by" | "set" | "return")
        }
        Some(Tok::Const | Tok::List(_)) => false,
    }
}

/// Characters operators are made of.
const OPERATOR: &[u8] = b"+-*/<>=~!@#%^&|`?";

/// Words after which `(` opens a list or a subquery, not a call's arguments.
const SPACED: &[&str] = &[
    "in", "values", "as", "and", "or", "not", "exists", "from", "join", "where", "on", "using",
    "select", "over", "filter", "within", "into", "then", "else", "when", "is",
];

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Const,
    /// `(...)` or `[...]`: a list of constants.
    List(&'static str),
    Word(String),
    Text(String),
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn utf8_len(c: u8) -> usize {
    match c {
        0xf0.. => 4,
        0xe0.. => 3,
        0xc0.. => 2,
        _ => 1,
    }
}

fn skip_block_comment(b: &[u8], mut i: usize) -> usize {
    // Nested, as PostgreSQL's are.
    let mut depth = 0usize;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            depth += 1;
            i += 2;
        } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// The index after the closing `q` (doubled `q` is an escape; with
/// `backslash`, so is `\x`); the end of input for a text cut short.
fn skip_quoted(b: &[u8], mut i: usize, q: u8, backslash: bool) -> usize {
    while i < b.len() {
        if backslash && b[i] == b'\\' {
            i += 2;
        } else if b[i] == q {
            if b.get(i + 1) == Some(&q) {
                i += 2;
            } else {
                return i + 1;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// `$tag$…$tag$` starting at `i`: the index after it (end of input if cut
/// short); None when `i` does not start a dollar quote.
fn dollar_quote_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] >= 0x80) {
        j += 1;
    }
    if b.get(j) != Some(&b'$') || b.get(i + 1).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let tag = &b[i..=j];
    let body = j + 1;
    Some(
        b[body..]
            .windows(tag.len())
            .position(|w| w == tag)
            .map_or(b.len(), |p| body + p + tag.len()),
    )
}

fn skip_number(b: &[u8], mut i: usize) -> usize {
    if b[i] == b'0' && matches!(b.get(i + 1), Some(b'x' | b'X' | b'o' | b'O' | b'b' | b'B')) {
        i += 2;
        while i < b.len() && (b[i].is_ascii_hexdigit() || b[i] == b'_') {
            i += 1;
        }
        return i;
    }
    while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_' || b[i] == b'.') {
        i += 1;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if j < b.len() && b[j].is_ascii_digit() {
            i = j;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
        }
    }
    i
}

/// `( ? , ? … )` after IN or VALUES (and between VALUES rows) becomes
/// `(...)`, `[ ? , … ]` after ARRAY `[...]`; then `(...), (...)` runs of
/// VALUES rows become one, so that the row count does not make a new query.
fn collapse_lists(toks: &mut Vec<Tok>) {
    let mut out: Vec<Tok> = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let open = match &toks[i] {
            Tok::Text(t) if t == "(" => Some((")", "(...)")),
            Tok::Text(t) if t == "[" => Some(("]", "[...]")),
            _ => None,
        };
        if let Some((close, list)) = open {
            let after = match out.last() {
                Some(Tok::Word(w)) => matches!(w.as_str(), "in" | "values" | "array"),
                Some(Tok::Text(t)) => {
                    t == "," && out.len() >= 2 && matches!(out[out.len() - 2], Tok::List("(...)"))
                }
                _ => false,
            };
            if after {
                if let Some(end) = const_list_end(toks, i + 1, close) {
                    let prev_list = out.len() >= 2
                        && out[out.len() - 2] == Tok::List(list)
                        && out.last() == Some(&Tok::Text(",".into()));
                    if prev_list {
                        out.pop();
                    } else {
                        out.push(Tok::List(list));
                    }
                    i = end + 1;
                    continue;
                }
            }
        }
        out.push(std::mem::replace(&mut toks[i], Tok::Const));
        i += 1;
    }
    *toks = out;
}

/// The index of `close` when `toks[i..]` is `? (, ?)* close`.
fn const_list_end(toks: &[Tok], mut i: usize, close: &str) -> Option<usize> {
    let mut want_const = true;
    while i < toks.len() {
        match (&toks[i], want_const) {
            (Tok::Const, true) => want_const = false,
            (Tok::Text(t), false) if t == "," => want_const = true,
            (Tok::Text(t), false) if t == close => return Some(i),
            // `?::int` and `-?` are constants too.
            (Tok::Text(t), false) if t == ":" => {
                let ok = matches!(toks.get(i + 1), Some(Tok::Text(c)) if c == ":")
                    && matches!(toks.get(i + 2), Some(Tok::Word(_)));
                if !ok {
                    return None;
                }
                i += 2;
            }
            (Tok::Text(t), true) if t == "-" || t == "+" => {}
            _ => return None,
        }
        i += 1;
    }
    None
}

fn render(toks: &[Tok]) -> String {
    let mut s = String::new();
    let mut prev: Option<&Tok> = None;
    for t in toks {
        let text = match t {
            Tok::Const => "?",
            Tok::List(l) => l,
            Tok::Word(w) | Tok::Text(w) => w.as_str(),
        };
        if let Some(p) = prev {
            if space_between(p, t) {
                s.push(' ');
            }
        }
        s.push_str(text);
        prev = Some(t);
        if s.len() > MAX_TEXT {
            break;
        }
    }
    while s.ends_with(';') || s.ends_with(' ') {
        s.pop();
    }
    if s.len() > MAX_TEXT {
        let mut cut = MAX_TEXT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// Words and constants are separated by a space; punctuation hugs what
/// it belongs to (`f(?)`, `a.b`, `x::int`, `a, b`).
fn space_between(prev: &Tok, next: &Tok) -> bool {
    let text = |t: &Tok| -> Option<String> {
        match t {
            Tok::Text(x) => Some(x.clone()),
            _ => None,
        }
    };
    let p = text(prev);
    let n = text(next);
    if matches!(n.as_deref(), Some("," | ")" | "]" | "." | ";" | ":"))
        || matches!(p.as_deref(), Some("(" | "[" | "." | ":"))
    {
        return false;
    }
    // A call or a subscript: `count(`, `a[`.
    if (matches!(n.as_deref(), Some("(" | "[")) || *next == Tok::List("[...]"))
        && matches!(prev, Tok::Word(w) if !SPACED.contains(&w.as_str()))
    {
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sqlcommenter_traceparent_is_found_and_checked() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let q = format!(
            "SELECT * FROM t WHERE id = 5 /*action='show',traceparent='{tp}',tracestate='x'*/"
        );
        assert_eq!(traceparent(&q).as_deref(), Some(tp));
        // URL-encoded dashes, upper-case hex.
        let enc = "select 1 /*traceparent='00%2D4BF92F3577B34DA6A3CE929D0E0E4736%2D00F067AA0BA902B7%2D01'*/";
        assert_eq!(traceparent(enc).as_deref(), Some(tp));
        // Not in a comment, malformed, all-zero ids, cut short: none.
        assert_eq!(traceparent(&format!("select 'traceparent=''{tp}'''")), None);
        assert_eq!(
            traceparent("select 1 /*traceparent='00-abc-def-01'*/"),
            None
        );
        let zero =
            "select 1 /*traceparent='00-00000000000000000000000000000000-00f067aa0ba902b7-01'*/";
        assert_eq!(traceparent(zero), None);
        assert_eq!(traceparent("select 1 /*traceparent='00-4bf9"), None);
        assert_eq!(traceparent("select 1"), None);
    }

    #[test]
    fn literals_numbers_and_params_go() {
        assert_eq!(
            normalize("SELECT abalance FROM pgbench_accounts WHERE aid = 4711;"),
            "select abalance from pgbench_accounts where aid = ?"
        );
        assert_eq!(
            normalize("update t set a = 'x''y', b = E'\\'q', c = 1.5e-3 where d = $1"),
            "update t set a = ?, b = ?, c = ? where d = ?"
        );
        assert_eq!(
            normalize("select $f$ body $ $f$, $$x$$, 0x1F, .5"),
            "select ?, ?, ?, ?"
        );
    }

    #[test]
    fn lists_collapse_whatever_their_length() {
        let a = normalize("select * from t where id in (1, 2, 3) and x = any(array[1,2])");
        let b = normalize("select * from t where id IN (7) and x = any(ARRAY[3])");
        assert_eq!(
            a,
            "select * from t where id in (...) and x = any(array[...])"
        );
        assert_eq!(a, b);
        assert_eq!(
            normalize("insert into t values (1, 'a'), (2, 'b'), (3, 'c')"),
            normalize("insert into t values (9, 'z')")
        );
        assert_eq!(
            normalize("insert into t values (1, 'a'), (2, 'b')"),
            "insert into t values (...)"
        );
    }

    #[test]
    fn a_sign_is_part_of_its_constant_unless_it_subtracts() {
        assert_eq!(
            normalize("select -5, x - 5, x-5, x + -5"),
            "select ?, x - ?, x - ?, x + ?"
        );
        assert_eq!(
            normalize("where a = -1.5 and b in (-1, +2)"),
            "where a = ? and b in (...)"
        );
        assert_eq!(normalize("select f(-1) - -2"), "select f(?) - ?");
        assert_eq!(normalize("-3"), "?");
    }

    #[test]
    fn identifiers_and_comments() {
        assert_eq!(
            normalize("select \"Col1\", t2.c3 /* secret 42 */ from t2 -- 'x'\n where c3 > 0"),
            "select \"Col1\", t2.c3 from t2 where c3 > ?"
        );
        assert_eq!(normalize("select x::int8 from t"), "select x::int8 from t");
    }

    #[test]
    fn cut_texts_and_odd_bytes_do_not_panic() {
        for s in [
            "select 'unterminated",
            "select $a$ no end",
            "/* open",
            "select E'\\",
            "select 1e",
            "select $",
            "é'ü",
            "0x",
        ] {
            let n = normalize(s);
            assert!(n.len() <= MAX_TEXT + 3, "{s:?} -> {n:?}");
        }
        let long = format!("select {}", "a, ".repeat(2000));
        assert!(normalize(&long).ends_with('…'));
    }

    /// Texts of `pg_stat_activity.query` captured under pgbench (simple,
    /// extended and prepared protocols) on PostgreSQL 15: the same
    /// statement with other values, or as `$n`, is one normalized text.
    #[test]
    fn real_activity_texts_lose_every_value() {
        let texts = include_str!("../../../../tests/fixtures/pgstat/activity-queries-pg15.txt");
        let mut shapes = std::collections::BTreeSet::new();
        for t in texts.lines().filter(|l| !l.trim().is_empty()) {
            let n = normalize(t);
            assert!(
                !n.contains(|c: char| c.is_ascii_digit() || c == '\''),
                "{t:?} -> {n:?}"
            );
            shapes.insert(n);
        }
        for want in [
            "update pgbench_branches set bbalance = bbalance + ? where bid = ?",
            "insert into items values (?, ? || ?, ?, array[...])",
            "select count(*) from pgbench_accounts where abalance > ? and bid = ? % ?",
            "select pg_sleep(?)",
            "end",
        ] {
            assert!(shapes.contains(want), "{want:?} not in {shapes:#?}");
        }
        // The sign of pgbench's negative :delta belongs to the constant:
        // `+ -297` and `+ 297` are one statement, as in pg_stat_statements.
        assert!(!shapes.iter().any(|s| s.contains("- ?")), "{shapes:#?}");
        assert!(shapes.len() <= 7, "{shapes:#?}");
    }

    #[test]
    fn fingerprints_are_stable() {
        assert_eq!(fingerprint(""), "cbf29ce484222325");
        assert_ne!(fingerprint("select ?"), fingerprint("select ?, ?"));
    }
}
