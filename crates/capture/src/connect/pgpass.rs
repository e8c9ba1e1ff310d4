//! The libpq password file (`~/.pgpass`, or `PGPASSFILE`):
//! `hostname:port:database:username:password` lines, read as libpq's
//! `passwordFromFile` reads them: the first matching line wins, `*` alone
//! in a field matches anything, `\:` and `\\` escape, `#` starts a comment
//! line, and the file is ignored (with a warning) when it is not a plain
//! file or group/world can access it.
use std::io::BufRead;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What a connection attempt is matched against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key<'a> {
    /// The host as libpq matches it: `localhost` for the default socket
    /// directory (and when no host was given), else the host or socket
    /// directory as given.
    pub host: &'a str,
    pub port: &'a str,
    pub database: &'a str,
    pub user: &'a str,
}

/// The password of the first line matching `key`, if any.
pub fn lookup(reader: impl BufRead, key: &Key<'_>) -> Option<String> {
    if key.database.is_empty() || key.user.is_empty() {
        return None;
    }
    for line in reader.split(b'\n') {
        let Ok(line) = line else {
            return None;
        };
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let rest = [key.host, key.port, key.database, key.user]
            .iter()
            .try_fold(line, |rest, want| field_matches(rest, want));
        if let Some(rest) = rest {
            return Some(unescape_password(rest));
        }
    }
    None
}

/// If the field at the start of `line` matches `want`, the text after its
/// `:`; libpq's `pwdfMatchesString`, step for step (an unescaped `:` also
/// matches a `:` in `want`, so `::1:5432:…` matches the host `::1`).
fn field_matches<'l>(line: &'l str, want: &str) -> Option<&'l str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut want = want.chars().peekable();
    let mut chars = line.char_indices();
    while let Some((i, c)) = chars.next() {
        let (c, escaped) = if c == '\\' {
            match chars.next() {
                Some((_, n)) => (n, true),
                None => return None,
            }
        } else {
            (c, false)
        };
        if c == ':' && !escaped && want.peek().is_none() {
            return Some(&line[i + 1..]);
        }
        if want.next() != Some(c) {
            return None;
        }
    }
    None
}

/// The password field: up to the first unescaped `:`, backslashes removed.
fn unescape_password(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            ':' => break,
            '\\' => match chars.next() {
                Some(n) => out.push(n),
                None => out.push('\\'),
            },
            c => out.push(c),
        }
    }
    out
}

/// Why a password file was not used, for the warning libpq also prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ignored {
    NotAPlainFile,
    GroupOrWorldAccess,
}

impl Ignored {
    pub fn warning(&self, path: &Path) -> String {
        match self {
            Ignored::NotAPlainFile => {
                format!("password file \"{}\" is not a plain file", path.display())
            }
            Ignored::GroupOrWorldAccess => format!(
                "password file \"{}\" has group or world access; permissions should be u=rw (0600) or less (fix: chmod 600 {})",
                path.display(),
                path.display()
            ),
        }
    }
}

/// Look `key` up in the file at `path`. `Ok(None)` when the file is
/// missing, unreadable or has no matching line; `Err` when libpq would
/// ignore it with a warning.
pub fn lookup_file(path: &Path, key: &Key<'_>) -> Result<Option<String>, Ignored> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Err(Ignored::NotAPlainFile);
    }
    if meta.mode() & 0o077 != 0 {
        return Err(Ignored::GroupOrWorldAccess);
    }
    match std::fs::File::open(path) {
        Ok(f) => Ok(lookup(std::io::BufReader::new(f), key)),
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(host: &'a str, port: &'a str, database: &'a str, user: &'a str) -> Key<'a> {
        Key {
            host,
            port,
            database,
            user,
        }
    }

    fn find(file: &str, k: &Key<'_>) -> Option<String> {
        lookup(std::io::Cursor::new(file.as_bytes()), k)
    }

    #[test]
    fn first_matching_line_wins_and_wildcards_match_anything() {
        let file = "\
# comment:*:*:*:nope
db1.example:5432:app:bob:first
*:5432:*:bob:second
*:*:*:*:any
";
        assert_eq!(
            find(file, &key("db1.example", "5432", "app", "bob")).as_deref(),
            Some("first")
        );
        assert_eq!(
            find(file, &key("db2.example", "5432", "app", "bob")).as_deref(),
            Some("second")
        );
        assert_eq!(
            find(file, &key("db1.example", "5433", "app", "bob")).as_deref(),
            Some("any")
        );
        assert_eq!(find("", &key("h", "1", "d", "u")), None);
        // A comment line is never a match, even one that would match.
        assert_eq!(find("#h:1:d:u:x\n", &key("#h", "1", "d", "u")), None);
    }

    #[test]
    fn fields_match_whole_values_only() {
        let file = "local:5432:app:bob:x\n";
        assert_eq!(find(file, &key("localhost", "5432", "app", "bob")), None);
        assert_eq!(find(file, &key("loca", "5432", "app", "bob")), None);
        assert_eq!(find(file, &key("local", "54321", "app", "bob")), None);
        // `*` is a wildcard only as the whole field.
        assert_eq!(find("a*:1:d:u:x\n", &key("ab", "1", "d", "u")), None);
        assert_eq!(
            find("a*:1:d:u:x\n", &key("a*", "1", "d", "u")).as_deref(),
            Some("x")
        );
    }

    #[test]
    fn escapes_in_fields_and_password() {
        let file = "host\\:x:5432:d\\\\b:u:pa\\:ss\\\\word:ignored\r\n";
        assert_eq!(
            find(file, &key("host:x", "5432", "d\\b", "u")).as_deref(),
            Some("pa:ss\\word")
        );
        // A password with a trailing backslash, and an empty one.
        assert_eq!(
            find("h:1:d:u:p\\\n", &key("h", "1", "d", "u")).as_deref(),
            Some("p\\")
        );
        assert_eq!(
            find("h:1:d:u:\n", &key("h", "1", "d", "u")).as_deref(),
            Some("")
        );
        // Too few fields: no match.
        assert_eq!(find("h:1:d\n", &key("h", "1", "d", "u")), None);
        // An IPv6 address may be written unescaped, as libpq reads it.
        assert_eq!(
            find("::1:5432:d:u:six\n", &key("::1", "5432", "d", "u")).as_deref(),
            Some("six")
        );
    }

    #[test]
    fn empty_user_or_database_never_match() {
        assert_eq!(find("*:*:*:*:x\n", &key("h", "1", "", "u")), None);
        assert_eq!(find("*:*:*:*:x\n", &key("h", "1", "d", "")), None);
    }

    #[test]
    fn the_file_is_ignored_when_others_can_read_it() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("pgpass");
        std::fs::write(&f, "*:*:*:*:secret\n").unwrap();
        let k = key("h", "1", "d", "u");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(lookup_file(&f, &k), Ok(Some("secret".into())));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(lookup_file(&f, &k), Err(Ignored::GroupOrWorldAccess));
        assert!(Ignored::GroupOrWorldAccess
            .warning(&f)
            .contains("chmod 600"));
        assert_eq!(lookup_file(d.path(), &k), Err(Ignored::NotAPlainFile));
        assert_eq!(lookup_file(&d.path().join("none"), &k), Ok(None));
    }
}
