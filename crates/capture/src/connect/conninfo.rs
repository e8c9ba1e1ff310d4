//! libpq connection strings, both forms: `key=value` pairs
//! (`host=/var/run/postgresql user=postgres`) and URIs
//! (`postgresql://user:secret@host:5432/db?sslmode=require`), parsed into
//! (keyword, value) pairs in the order given, as libpq's `conninfo_parse`
//! and `conninfo_uri_parse` do. Validation of keywords and values is the
//! caller's ([`super::ConnSpec`]).
//!
//! Error messages never quote values: a mistyped string may hold a password.

const URI_PREFIXES: [&str; 2] = ["postgresql://", "postgres://"];

/// The pairs of a connection string, in order; a later keyword overrides an earlier one.
pub fn parse(s: &str) -> Result<Vec<(String, String)>, String> {
    for prefix in URI_PREFIXES {
        if let Some(rest) = s.strip_prefix(prefix) {
            return parse_uri(rest);
        }
    }
    parse_pairs(s)
}

/// Whether `s` is the URI form.
pub fn is_uri(s: &str) -> bool {
    URI_PREFIXES.iter().any(|p| s.starts_with(p))
}

/// `v` as a single-quoted value of the `key=value` form, with `\` and `'`
/// escaped as [`parse`] reads them back.
pub fn quote(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `key = value` pairs separated by whitespace; values may be single-quoted,
/// and a backslash escapes the next character in either form.
fn parse_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    loop {
        while it.peek().is_some_and(|c| c.is_whitespace()) {
            it.next();
        }
        if it.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(&c) = it.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            it.next();
        }
        while it.peek().is_some_and(|c| c.is_whitespace()) {
            it.next();
        }
        if it.next() != Some('=') {
            return Err(format!(
                "missing \"=\" after the keyword {} in the connection string",
                quoted_keyword(&key)
            ));
        }
        while it.peek().is_some_and(|c| c.is_whitespace()) {
            it.next();
        }
        let mut value = String::new();
        if it.peek() == Some(&'\'') {
            it.next();
            loop {
                match it.next() {
                    None => {
                        return Err(format!(
                            "unterminated quoted value for {} in the connection string",
                            quoted_keyword(&key)
                        ))
                    }
                    Some('\'') => break,
                    Some('\\') => {
                        if let Some(c) = it.next() {
                            value.push(c);
                        }
                    }
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(&c) = it.peek() {
                if c.is_whitespace() {
                    break;
                }
                it.next();
                if c == '\\' {
                    if let Some(c) = it.next() {
                        value.push(c);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

/// A keyword for an error message: quoted when it looks like one, else
/// not shown (it may be the tail of a password with a space in it).
pub fn quoted_keyword(key: &str) -> String {
    if !key.is_empty()
        && key.len() <= 40
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        format!("\"{key}\"")
    } else {
        "(not shown)".into()
    }
}

/// `[user[:password]@][host][:port][,host[:port]…][/dbname][?key=value&…]`,
/// after the scheme.
fn parse_uri(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let (main, query) = match s.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (s, None),
    };
    // The credentials end at the last '@' before the path, as in libpq
    // (a password may hold '@' only percent-encoded).
    let (authority, path) = match main.find('/') {
        Some(i) => (&main[..i], Some(&main[i + 1..])),
        None => (main, None),
    };
    let hostspec = match authority.rsplit_once('@') {
        Some((cred, hosts)) => {
            let (user, password) = match cred.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (cred, None),
            };
            if !user.is_empty() {
                out.push(("user".into(), decode(user, "the user name")?));
            }
            if let Some(p) = password {
                out.push(("password".into(), decode(p, "the password")?));
            }
            hosts
        }
        None => authority,
    };
    if !hostspec.is_empty() {
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        for chunk in hostspec.split(',') {
            let (host, port) = if let Some(rest) = chunk.strip_prefix('[') {
                let (h, after) = rest
                    .split_once(']')
                    .ok_or("unterminated IPv6 address ('[' without ']') in the URI")?;
                let port = match after {
                    "" => None,
                    p => Some(
                        p.strip_prefix(':')
                            .ok_or("unexpected character after an IPv6 address in the URI")?,
                    ),
                };
                (h.to_string(), port)
            } else {
                match chunk.split_once(':') {
                    Some((h, p)) => (decode(h, "a host name")?, Some(p)),
                    None => (decode(chunk, "a host name")?, None),
                }
            };
            hosts.push(host);
            ports.push(decode(port.unwrap_or(""), "a port")?);
        }
        if hosts.iter().any(|h| !h.is_empty()) {
            out.push(("host".into(), hosts.join(",")));
        }
        if ports.iter().any(|p| !p.is_empty()) {
            out.push(("port".into(), ports.join(",")));
        }
    }
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        out.push(("dbname".into(), decode(db, "the database name")?));
    }
    for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            format!(
                "missing \"=\" after the URI parameter {}",
                quoted_keyword(kv)
            )
        })?;
        let k = decode(k, "a parameter name")?;
        let v = decode(v, "a parameter value")?;
        // libpq's JDBC-compatible spelling.
        if k == "ssl" && v == "true" {
            out.push(("sslmode".into(), "require".into()));
        } else {
            out.push((k, v));
        }
    }
    Ok(out)
}

/// Percent-decoding (`%2F` → `/`); `what` names the part for the error.
fn decode(s: &str, what: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("invalid percent-encoding in {what} of the URI"))?;
            if hex == 0 {
                return Err(format!("forbidden %00 in {what} of the URI"));
            }
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{what} of the URI is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &str) -> Vec<(String, String)> {
        parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn p(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn key_value_pairs_with_quotes_and_escapes() {
        assert_eq!(
            pairs("host=/tmp  port = 5433 user='a b' password='it\\'s' dbname=x\\ y"),
            p(&[
                ("host", "/tmp"),
                ("port", "5433"),
                ("user", "a b"),
                ("password", "it's"),
                ("dbname", "x y"),
            ])
        );
        assert_eq!(pairs(""), vec![]);
        assert_eq!(pairs("   "), vec![]);
        assert_eq!(pairs("password=''"), p(&[("password", "")]));
    }

    #[test]
    fn errors_do_not_quote_values() {
        // "password=se cret": "cret" is read as a keyword.
        let e = parse("password=se cret").unwrap_err();
        assert!(e.contains("\"cret\""), "{e}"); // looks like a keyword, so named
        let e = parse("password=se Cr3t!").unwrap_err();
        assert!(!e.contains("Cr3t"), "{e}");
        let e = parse("password='secret").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        assert!(e.contains("unterminated"), "{e}");
    }

    #[test]
    fn uris() {
        assert_eq!(
            pairs(
                "postgresql://bob:s%40cret@db.example:5433/app?sslmode=require&connect_timeout=3"
            ),
            p(&[
                ("user", "bob"),
                ("password", "s@cret"),
                ("host", "db.example"),
                ("port", "5433"),
                ("dbname", "app"),
                ("sslmode", "require"),
                ("connect_timeout", "3"),
            ])
        );
        assert_eq!(
            pairs("postgres://%2Fvar%2Frun%2Fpostgresql/db"),
            p(&[("host", "/var/run/postgresql"), ("dbname", "db")])
        );
        assert_eq!(
            pairs("postgresql:///db?host=/tmp&port=5499"),
            p(&[("dbname", "db"), ("host", "/tmp"), ("port", "5499")])
        );
        assert_eq!(
            pairs("postgresql://[::1]:5433,h2/x"),
            p(&[("host", "::1,h2"), ("port", "5433,"), ("dbname", "x")])
        );
        assert_eq!(pairs("postgresql://"), vec![]);
        assert!(is_uri("postgres://h/x") && is_uri("postgresql://") && !is_uri("host=h"));
        let odd = "a b'c\\d";
        assert_eq!(
            parse(&format!("k={}", quote(odd))).unwrap(),
            vec![("k".to_string(), odd.to_string())]
        );
        assert_eq!(
            pairs("postgresql://u@?ssl=true"),
            p(&[("user", "u"), ("sslmode", "require")])
        );
        assert!(parse("postgresql://h/db?sslmode").is_err());
        assert!(parse("postgresql://u:%zz@h").is_err());
        assert!(parse("postgresql://[::1/x").is_err());
    }
}
